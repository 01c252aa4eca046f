#!/usr/bin/env bash
# gpu_dist_run.sh -- the distributed tools on a multi-GPU box, unattended, in one go (issue 10).
#
#   OUT=/path/to/out bash scripts/gpu_dist_run.sh        # from the repository root
#
# Runs, in order, each step with its own timeout, carrying on after a failed step:
#   env            nvidia-smi, topo -m, torch/NCCL versions, NCCL_*/TORCH_* variables
#   smoke          dist_smoke_test on all GPUs (NCCL_DEBUG=INFO to nccl_logs/smoke.*)
#   smoke_1gpu     dist_smoke_test with one rank (world size 1 answer)
#   hang           dist_smoke_test, rank 1 sleeps before all_reduce: must be named and killed (>= 2 GPUs)
#   bench_ar       collective_bench all_reduce 32K..16G (wall time vs nccl-tests' 13 s on 2xH200)
#   bench_all      collective_bench, all five ops, 32K..16G, with the PNG plot
#   bench_blocking collective_bench all_reduce 32K..64M, blocking mode (the naive-loop comparison)
#   p2p            p2p_bandwidth
#   topology       gpu_topology
#   nccl_info      collective_bench 32K..64M with NCCL_DEBUG=INFO and more subsystems (log fixtures)
#   fr_hang        an NCCL hang left to the watchdog with the flight recorder on: dumps in fr/ (>= 2 GPUs)
#   nccl_tests     nccl-tests all_reduce_perf, only if it is on PATH (or NCCL_TESTS_BIN is set)
#   compare        bench/collective_vs_nccl_tests.py: ratios against nccl-tests figures
#   pytest_gpu     tests/gpu/test_dist_gpu.py -m gpu
# Everything lands in $OUT/gpu_dist_run.tar.gz; $OUT/summary.txt (steps, exit codes, seconds and the
# headline figures) and the plot are also copied beside it. NCCL_* settings of the machine are kept.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_dist_out}
BUDGET_S=${BUDGET_S:-560}                 # stop starting steps once this much wall time is used
MAXB=${MAXB:-16G} SMALLMAX=${SMALLMAX:-64M}  # sweep tops; MAXB=1M SMALLMAX=256K tries the script on a CPU box
WORK=$(mktemp -d /tmp/gpu_dist_run.XXXXXX)
mkdir -p "$OUT" "$WORK/nccl_logs" "$WORK/fr"
MLENG_GPU_ENV_DIR=$WORK      # gpu_env.sh installs the carried wheels (pydantic...) under the run's private folder
[ -f scripts/gpu_env.sh ] && . scripts/gpu_env.sh
export MLENG_HOME=${MLENG_HOME:-$WORK/mleng-home} PYTHONUNBUFFERED=1
export MLENG_RUN_TAG=$WORK        # inherited by every process we start: how cleanup finds ours, and only ours
PY=${PYTHON:-python3}
T0=$(date +%s)
SUMMARY=$WORK/summary.txt
NGPU=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
echo "gpu_dist_run $(date -u +%FT%TZ) host=$(hostname) gpus=$NGPU" | tee "$SUMMARY"
$PY -c 'import importlib.util as u; print("python modules:", ", ".join(m + ("=yes" if u.find_spec(m) else "=MISSING") for m in ("torch", "pydantic", "psutil", "pynvml", "matplotlib", "pytest")))' 2>&1 | tee -a "$SUMMARY"

# Ranks live in their own sessions (torchrun), so a timeout's group kill can miss them: after every
# step, kill by pid whatever still carries this run's tag in its environment.
cleanup() {
  local p
  for p in $(pgrep -f "tools\._ranks|torch\.distributed\.run|tools\.(dist_smoke_test|collective_bench|p2p_bandwidth)" || true); do
    [ "$p" = "$$" ] && continue
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "MLENG_RUN_TAG=$WORK"; then
      echo "cleanup: killing leftover pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-150)" | tee -a "$SUMMARY"
      kill -9 "$p" 2>/dev/null
    fi
  done
}

# step NAME TIMEOUT_S CMD... : run with a timeout, stdout/stderr to $WORK/NAME.{out,err}, note rc and time
step() {
  local name=$1 limit=$2; shift 2
  local used=$(( $(date +%s) - T0 )) left
  left=$(( BUDGET_S - used ))
  if [ "$left" -lt 15 ]; then printf '%-15s SKIPPED (budget used: %ss)\n' "$name" "$used" | tee -a "$SUMMARY"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local s=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
  local rc=$?
  cleanup
  local secs=$(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  printf '%-15s rc=%-4s %7ss  (limit %ss)\n' "$name" "$rc" "$secs" "$limit" | tee -a "$SUMMARY"
}

step env 60 bash -c "nvidia-smi; nvidia-smi topo -m; $PY -c 'import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())'; env | grep -E '^(NCCL|TORCH|CUDA|PYTORCH)_' | sort"
NCCL_DEBUG=INFO NCCL_DEBUG_FILE=$WORK/nccl_logs/smoke.%h.%p.log step smoke 120 $PY -m tools.dist_smoke_test --json
step smoke_1gpu 90 $PY -m tools.dist_smoke_test --nproc-per-node 1 --json
if [ "$NGPU" -ge 2 ]; then   # a hang needs a peer to wait for
  NCCL_DEBUG=INFO NCCL_DEBUG_FILE=$WORK/nccl_logs/hang.%h.%p.log \
    step hang 150 $PY -m tools.dist_smoke_test --inject-fault sleep_before_all_reduce --fault-rank 1 --pg-timeout-s 20 --json
fi
step bench_ar 180 $PY -m tools.collective_bench --ops all_reduce --min-bytes 32K --max-bytes $MAXB --factor 2 \
  --plot-path "$WORK/bench_ar.png" --json
step bench_all 330 $PY -m tools.collective_bench --ops all_reduce all_gather reduce_scatter all_to_all broadcast \
  --min-bytes 32K --max-bytes $MAXB --factor 2 --plot-path "$WORK/bench_all.png" --json
step bench_blocking 90 $PY -m tools.collective_bench --ops all_reduce --min-bytes 32K --max-bytes $SMALLMAX --blocking --no-plot --json
step p2p 120 $PY -m tools.p2p_bandwidth --json
step topology 60 $PY -m tools.gpu_topology --json
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH,TUNING,NET,P2P NCCL_DEBUG_FILE=$WORK/nccl_logs/bench.%h.%p.log \
  step nccl_info 120 $PY -m tools.collective_bench --ops all_reduce all_gather --min-bytes 32K --max-bytes $SMALLMAX --no-plot --json
if [ "$NGPU" -ge 2 ]; then
  TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_ON_TIMEOUT=1 \
  TORCH_FR_DUMP_TEMP_FILE=$WORK/fr/nccl_trace_rank_ TORCH_NCCL_DEBUG_INFO_TEMP_FILE=$WORK/fr/nccl_trace_rank_ \
  NCCL_DEBUG=INFO NCCL_DEBUG_FILE=$WORK/nccl_logs/fr_hang.%h.%p.log PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} \
    step fr_hang 120 $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m tools.dist_smoke_test.rank \
    '{"timeout_s": 20, "fault": "sleep_before_all_reduce", "fault_rank": 1, "watchdog_only": true, "numel": 1048576, "alloc_mib": 16}'
  ls -la "$WORK/fr" >>"$WORK/fr_hang.out" 2>&1
  command -v torchfrtrace >/dev/null && step fr_trace 60 torchfrtrace "$WORK/fr" -j --allow-incomplete-ranks
fi
NCCL_TESTS_BIN=${NCCL_TESTS_BIN:-$(command -v all_reduce_perf || true)}
if [ -n "$NCCL_TESTS_BIN" ] && [ "$NGPU" -ge 2 ]; then
  step nccl_tests 120 "$NCCL_TESTS_BIN" -b 32K -e 16G -f 2 -g "$NGPU"
fi
step compare 60 $PY bench/collective_vs_nccl_tests.py --ours "$WORK/bench_ar.out" \
  ${NCCL_TESTS_BIN:+--nccl-tests "$WORK/nccl_tests.out"} --wall-s "$(awk '/^bench_ar /{gsub("s","",$3); print $3}' "$SUMMARY")"
step pytest_gpu 240 $PY -m pytest tests/gpu/test_dist_gpu.py -m gpu -q -s -p no:cacheprovider

# Headline figures into the summary (each guarded: a failed step leaves its line out).
$PY - "$WORK" >>"$SUMMARY" 2>&1 <<'EOF'
import json, sys, pathlib
work = pathlib.Path(sys.argv[1])
def load(name):
    try:
        text = (work / f"{name}.out").read_text()
        return json.loads(text[text.index("{"):])
    except Exception as exc:
        print(f"{name}: no JSON result ({type(exc).__name__})"); return None
for name in ("smoke", "smoke_1gpu", "hang"):
    r = load(name)
    if r: print(f"{name}: {r['verdict']} culprits={r.get('culprit_ranks')} elapsed={r.get('elapsed_s')}s | {r['findings'][:3]}")
for name in ("bench_ar", "bench_all", "bench_blocking", "nccl_info"):
    r = load(name)
    if r:
        print(f"{name}: {r['verdict']} wall={r.get('sweep_wall_s')}s wrong={r.get('wrong_elements')} "
              f"expected={r.get('expected_busbw_gbps')} ({r.get('expected_source')})")
        for s in r.get("summary", []):
            print(f"   {s['op']:<15} peak {s['peak_busbw_gbps']:8.1f} GB/s at {s['peak_bytes']}  avg {s['avg_busbw_gbps']:7.1f}")
        rows = [x for x in r.get("rows", []) if x["op"] == "all_reduce" and x["bytes"] in (32768, 1 << 20, 256 << 20, 1 << 30, 8 << 30, 16 << 30)]
        for x in rows:
            print(f"   all_reduce {x['bytes']:>12} B  {x['time_us']:10.1f} us  busbw {x['busbw_gbps']:8.2f} GB/s")
r = load("p2p")
if r: print(f"p2p: {r['verdict']} median={r.get('median_unidir_gbps')} local={r.get('local_copy_gbps')} | "
            + "; ".join(f"{p['src']}->{p['dst']} {p['link']} {p['unidir_gbps']} bi={p['bidir_gbps']} lat={p['latency_us']}us" for p in r.get("pairs", [])))
r = load("topology")
if r: print(f"topology: {r['verdict']} links={r.get('links')} | {r['findings']}")
print("fr dumps:", sorted(p.name for p in (work / "fr").iterdir()))
print("nccl logs:", sorted(p.name for p in (work / "nccl_logs").iterdir())[:12])
EOF
echo "total $(( $(date +%s) - T0 )) s" >>"$SUMMARY"
# Anything of ours still running would be a bug worth knowing about.
cleanup
cp "$SUMMARY" "$OUT/summary.txt"
for f in bench_all.png bench_ar.png; do [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/"; done
tar czf "$OUT/gpu_dist_run.tar.gz" -C "$WORK" . 2>/dev/null
ls -la "$OUT"
cat "$OUT/summary.txt"
