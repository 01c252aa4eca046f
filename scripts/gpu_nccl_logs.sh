#!/usr/bin/env bash
# Real NCCL_DEBUG=INFO logs for tests/fixtures/nccl/real/ (nccl_log_analyze's fixtures), from a GPU machine.
#
#   OUT=/tmp/nccl-logs bash scripts/gpu_nccl_logs.sh        # ~3 min; needs torch with CUDA, >= 1 GPU
#   mkdir -p tests/fixtures/nccl/real tests/fixtures/logs/real
#   cp -r $OUT/failures/* tests/fixtures/logs/real/ && rm -r $OUT/failures && cp -r $OUT/* tests/fixtures/nccl/real/
#
# Each run is a torchrun of a tiny all_reduce (3 x 256 MiB) with
# NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,TUNING,NET,P2P, stdout+stderr kept whole:
#   nccl_1gpu.log                 one rank
#   nccl_2gpu.log                 two ranks (P2P over NVLink on an H200 pair)
#   nccl_2gpu_p2p_disabled.log    two ranks with NCCL_P2P_DISABLE=1 (traffic through SHM: what the tool must flag)
#   nccl_2gpu_ring_simple.log     two ranks with NCCL_ALGO=Ring NCCL_PROTO=Simple (forced settings)
#   nccl_<N>gpu.log               every GPU of the machine, when it has more than 2
#   nccl_2gpu_files/              two ranks with NCCL_DEBUG_FILE=.../nccl.%h.%p (one file per process)
#   versions.txt                  torch / CUDA / NCCL / driver / GPU names, for the fixture README
# and real failures for log_triage (tests/fixtures/logs/real/), under $OUT/failures/:
#   watchdog_2gpu.log             rank 1 sleeps before an all_reduce, rank 0's NCCL watchdog fires after 20 s
#   cuda_oom_1gpu.log             a 1 TiB allocation: the CUDA OOM message with its real figures
#   device_assert_1gpu.log        an out-of-range index on the GPU: device-side assert
# A run that fails or hangs (120 s limit) leaves its log with the error; the script carries on.
set -u
OUT=${OUT:-$(pwd)/nccl-logs}
mkdir -p "$OUT"
PY=${PYTHON:-python}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

cat > "$WORK/nccl_allreduce.py" <<'PYEOF'
import os

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
x = torch.ones(64 << 20, device="cuda")  # 256 MiB of float32: large enough to pick the bandwidth algorithm
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
dist.barrier()
if dist.get_rank() == 0:
    print(f"all_reduce ok: world_size={dist.get_world_size()} value={x[0].item():.0f}", flush=True)
dist.destroy_process_group()
PYEOF

cat > "$WORK/failure.py" <<'PYEOF'
import datetime
import os
import sys
import time

import torch

scenario = sys.argv[1]
if scenario == "watchdog":
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=20), device_id=torch.device("cuda", local_rank))
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"rank {dist.get_rank()}: first all_reduce done", flush=True)
    if dist.get_rank() == 1:
        time.sleep(90)  # never joins the second all_reduce
    dist.all_reduce(x)
    torch.cuda.synchronize()
elif scenario == "cuda_oom":
    keep = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
elif scenario == "device_assert":
    t = torch.zeros(10, device="cuda")
    print(t[torch.tensor([20], device="cuda")].sum().item())
PYEOF

NGPU=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
{
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', '.'.join(map(str, torch.cuda.nccl.version())))" 2>&1
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv 2>&1
  nvidia-smi topo -m 2>&1
  echo "gpus seen by torch: $NGPU"
} > "$OUT/versions.txt"
if [ "$NGPU" -lt 1 ]; then
  echo "no GPU visible to torch: nothing to run (see $OUT/versions.txt)" >&2
  exit 1
fi

run() {  # run <log name> <nproc> [VAR=value ...]
  local name=$1 nproc=$2; shift 2
  echo "== $name (nproc $nproc${*:+, $*})"
  env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,TUNING,NET,P2P "$@" \
    timeout -k 10 120 $PY -m torch.distributed.run --standalone --nproc-per-node "$nproc" "$WORK/nccl_allreduce.py" \
    > "$OUT/$name" 2>&1
  echo "   exit $? , $(wc -l < "$OUT/$name") lines, $(grep -c 'NCCL INFO' "$OUT/$name") NCCL INFO lines"
}

run nccl_1gpu.log 1
if [ "$NGPU" -ge 2 ]; then
  run nccl_2gpu.log 2
  run nccl_2gpu_p2p_disabled.log 2 NCCL_P2P_DISABLE=1
  run nccl_2gpu_ring_simple.log 2 NCCL_ALGO=Ring NCCL_PROTO=Simple
  mkdir -p "$OUT/nccl_2gpu_files"
  run nccl_2gpu_files/torchrun.out 2 NCCL_DEBUG_FILE="$OUT/nccl_2gpu_files/nccl.%h.%p"
fi
if [ "$NGPU" -gt 2 ]; then
  run "nccl_${NGPU}gpu.log" "$NGPU"
fi

fail() {  # fail <log name> <nproc> <scenario>
  echo "== failures/$1"
  timeout -k 10 150 $PY -m torch.distributed.run --standalone --nproc-per-node "$2" "$WORK/failure.py" "$3" \
    > "$OUT/failures/$1" 2>&1
  echo "   exit $? (a failure is expected), $(wc -l < "$OUT/failures/$1") lines"
}
mkdir -p "$OUT/failures"
fail cuda_oom_1gpu.log 1 cuda_oom
fail device_assert_1gpu.log 1 device_assert
if [ "$NGPU" -ge 2 ]; then
  fail watchdog_2gpu.log 2 watchdog
fi
echo "logs in $OUT"
