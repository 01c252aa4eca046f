#!/usr/bin/env bash
# Real NCCL_DEBUG=INFO logs for tests/fixtures/nccl/real/ (nccl_log_analyze's fixtures), from a GPU machine.
#
#   OUT=/tmp/nccl-logs bash scripts/gpu_nccl_logs.sh        # ~1-2 min; needs torch with CUDA, >= 1 GPU
#   mkdir -p tests/fixtures/nccl/real && cp -r $OUT/* tests/fixtures/nccl/real/
#
# Each run is a torchrun of a tiny all_reduce (3 x 256 MiB) with
# NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,TUNING,NET, stdout+stderr kept whole:
#   nccl_1gpu.log                 one rank
#   nccl_2gpu.log                 two ranks (P2P over NVLink on an H200 pair)
#   nccl_2gpu_p2p_disabled.log    two ranks with NCCL_P2P_DISABLE=1 (traffic through SHM: what the tool must flag)
#   nccl_2gpu_ring_simple.log     two ranks with NCCL_ALGO=Ring NCCL_PROTO=Simple (forced settings)
#   nccl_<N>gpu.log               every GPU of the machine, when it has more than 2
#   nccl_2gpu_files/              two ranks with NCCL_DEBUG_FILE=.../nccl.%h.%p (one file per process)
#   versions.txt                  torch / CUDA / NCCL / driver / GPU names, for the fixture README
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
  env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,TUNING,NET "$@" \
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
echo "logs in $OUT"
