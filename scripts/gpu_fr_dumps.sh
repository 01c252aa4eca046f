#!/usr/bin/env bash
# Real NCCL flight-recorder dumps from deliberately broken jobs, for flight_recorder_analyze's fixtures.
#
# Needs 2+ NVIDIA GPUs on one node, torch with NCCL. Run from the repository root:
#     OUT=/tmp/fr-out bash scripts/gpu_fr_dumps.sh            # ~4-7 min with 4 GPUs
#     SCENARIOS="hung op_mismatch" OUT=... bash scripts/gpu_fr_dumps.sh      # a subset (each <= 110 s)
# Needs py-spy, pydantic and psutil for the hang_stack_dump part (the dumps themselves need only torch).
# Writes $OUT/nccl_<scenario>/rank_<r> (pickles written by PyTorch's watchdog on timeout, or by the
# job at the end when nothing timed out), expected.json (the right diagnosis), torchrun.log,
# analysis.json (our analyser, when pydantic is importable) and torch_fr_trace.txt (PyTorch's own
# analyser, for comparison), torchNNN_gloo_* (the CPU gloo scenarios made with this torch) and
# stackdump/ (hang_stack_dump on a live NCCL hang). Copy the nccl_* and torch*_gloo_* directories into
# tests/fixtures/flight_recorder/: tests/test_flight_recorder.py checks every directory there that
# has an expected.json.
#
# Half the scenarios use the older env var names (TORCH_NCCL_TRACE_BUFFER_SIZE,
# TORCH_NCCL_DEBUG_INFO_TEMP_FILE) and half the current ones (TORCH_FR_BUFFER_SIZE,
# TORCH_FR_DUMP_TEMP_FILE); TORCH_NCCL_DUMP_ON_TIMEOUT=1 is read by both generations.
set -u
OUT=${OUT:-/tmp/fr-out}
cd "$(dirname "$0")/.."
NGPU=$(python -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
[ "${FR_CPU_DRYRUN:-0}" = 1 ] && NGPU=3        # plumbing check on a CPU box (gloo, no automatic dumps)
if [ "$NGPU" -lt 2 ]; then
  echo "gpu_fr_dumps: needs at least 2 GPUs, found $NGPU" >&2
  exit 2
fi
WORLD=$(( NGPU < 4 ? NGPU : 4 ))
LAST=$(( WORLD - 1 ))
mkdir -p "$OUT"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" \
  > "$OUT/versions.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/versions.txt" 2>&1 || true

expect() {  # scenario -> expected diagnosis (culprits any of: problem one of)
  case "$1" in
    healthy)     echo '{"culprit_ranks": [], "problems": ["none"], "prefix": "rank_"}' ;;
    hung)        echo "{\"culprit_ranks\": [$LAST], \"problems\": [\"missing_ranks\", \"no_dump\"], \"prefix\": \"rank_\"}" ;;
    op_mismatch) echo '{"culprit_ranks": [1], "problems": ["op_mismatch"], "prefix": "rank_"}' ;;
    skipped)     echo '{"culprit_ranks": [1], "problems": ["op_mismatch", "size_mismatch"], "prefix": "rank_"}' ;;
    subgroup)    echo "{\"culprit_ranks\": [$LAST], \"problems\": [\"missing_ranks\", \"no_dump\"], \"prefix\": \"rank_\"}" ;;
  esac
}

i=0
for scenario in ${SCENARIOS:-healthy hung op_mismatch skipped subgroup}; do
  dir="$OUT/nccl_$scenario"
  rm -rf "$dir"; mkdir -p "$dir"
  if [ $((i % 2)) -eq 0 ]; then
    vars=(TORCH_FR_BUFFER_SIZE=2000 "TORCH_FR_DUMP_TEMP_FILE=$dir/rank_")
  else
    vars=(TORCH_NCCL_TRACE_BUFFER_SIZE=2000 "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=$dir/rank_")
  fi
  i=$((i + 1))
  echo "== $scenario (world $WORLD; ${vars[*]})"
  t0=$(date +%s)
  env "${vars[@]}" TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_NCCL_ENABLE_TIMING=1 \
    timeout -k 10 100 python -m torch.distributed.run --standalone --nproc-per-node "$WORLD" \
      tests/fixtures/flight_recorder/make_nccl_dumps.py "$scenario" > "$dir/torchrun.log" 2>&1
  echo "   torchrun exit $?, $(( $(date +%s) - t0 )) s, dumps: $(cd "$dir" && ls rank_* 2>/dev/null | grep -v tmp | tr '\n' ' ')"
  expect "$scenario" > "$dir/expected.json"
  echo "{\"world\": $WORLD, \"env\": \"${vars[*]}\"}" > "$dir/run.json"
  python -m tools.flight_recorder_analyze --path "$dir" --prefix rank_ --json > "$dir/analysis.json" 2>&1 || true
  python -c "import json,sys; d=json.load(open(sys.argv[1])); print('   ours:', d.get('verdict'), 'culprits', d.get('culprit_ranks'), [g.get('problem') for g in d.get('groups', [])])" \
    "$dir/analysis.json" 2>/dev/null || echo "   ours: (not run: $(tail -1 "$dir/analysis.json"))"
  timeout 60 python -m torch.distributed.flight_recorder.fr_trace "$dir" -p rank_ --allow-incomplete-ranks \
    > "$dir/torch_fr_trace.txt" 2>&1 || true
done
rm -f "$OUT"/nccl_*/rank_*.tmp

# The CPU (gloo) scenarios again with this machine's torch, a version other than the CPU box's:
# flight_recorder_analyze must read either.
TV=$(python -c "import torch; print('torch' + ''.join(torch.__version__.split('+')[0].split('.')[:2]))")
for scenario in hung op_mismatch; do
  echo "== gloo $scenario with $TV"
  dir="$OUT/${TV}_gloo_$scenario"; rm -rf "$dir"
  FR_OUT_DIR="$OUT/.gloo" timeout 120 python tests/fixtures/flight_recorder/make_dumps.py "$scenario" > /dev/null 2>&1
  mkdir -p "$dir" && cp "$OUT/.gloo/$scenario/pickle/"fr_* "$dir/" 2>/dev/null
  if python -c "import pickle,sys; sys.exit(0 if pickle.load(open(sys.argv[1], 'rb')).get('entries') else 1)" \
       "$dir/fr_0" 2>/dev/null; then
    case "$scenario" in
      hung) echo '{"culprit_ranks": [3], "problems": ["missing_ranks"], "prefix": "fr_"}' > "$dir/expected.json" ;;
      op_mismatch) echo '{"culprit_ranks": [2], "problems": ["op_mismatch"], "prefix": "fr_"}' > "$dir/expected.json" ;;
    esac
  else
    echo "$TV wrote no gloo flight-recorder entries (or no dump): nothing to check" > "$dir/NOTE.txt"
  fi
  echo "   dumps: $(cd "$dir" && ls fr_* 2>/dev/null | tr '\n' ' ')"
done
rm -rf "$OUT/.gloo"

# hang_stack_dump on a live NCCL hang: the 'hung' job again, with a 10-minute PG timeout, dumped with
# py-spy while it hangs (expected: the last rank named odd, the others waiting in torch.cuda.synchronize).
echo "== hang_stack_dump on a live NCCL hang (world $WORLD)"
sd="$OUT/stackdump"; rm -rf "$sd"; mkdir -p "$sd"
FR_PG_TIMEOUT_S=600 python -m torch.distributed.run --standalone --nproc-per-node "$WORLD" \
  tests/fixtures/flight_recorder/make_nccl_dumps.py hung > "$sd/torchrun.log" 2>&1 &
TR=$!
for _ in $(seq 180); do
  [ "$(grep -c '^BREAK' "$sd/torchrun.log" 2>/dev/null)" -ge "$WORLD" ] && break
  sleep 1
done
sleep 3
t0=$(date +%s%N)
timeout 120 python -m tools.hang_stack_dump --launcher-pid "$TR" --json > "$sd/hang_stack_dump.json" 2>&1
t1=$(date +%s%N)
timeout 300 python -m tools.hang_stack_dump --launcher-pid "$TR" --native --save-path "$sd/native_stacks.txt" \
  --json > "$sd/hang_stack_dump_native.json" 2>&1
t2=$(date +%s%N)
echo "   plain: $(( (t1 - t0) / 1000000 )) ms, native: $(( (t2 - t1) / 1000000 )) ms"
python -c "import json,sys; d=json.load(open(sys.argv[1])); print('   odd ranks', d.get('odd_ranks'), '|', ' '.join(d.get('findings', [])[:3]))" \
  "$sd/hang_stack_dump.json" 2>/dev/null || echo "   (hang_stack_dump failed: $(tail -2 "$sd/hang_stack_dump.json"))"
kill "$TR" 2>/dev/null
for _ in $(seq 45); do kill -0 "$TR" 2>/dev/null || break; sleep 1; done
kill -9 "$TR" 2>/dev/null
wait "$TR" 2>/dev/null
echo "done: $OUT"
