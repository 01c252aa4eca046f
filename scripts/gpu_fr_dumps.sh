#!/usr/bin/env bash
# Real NCCL flight-recorder dumps from deliberately broken jobs, for flight_recorder_analyze's fixtures.
#
# Needs 2+ NVIDIA GPUs on one node, torch with NCCL. Run from the repository root:
#     OUT=/tmp/fr-out bash scripts/gpu_fr_dumps.sh            # ~4-6 min with 4 GPUs
# Writes $OUT/nccl_<scenario>/rank_<r> (pickles written by PyTorch's watchdog on timeout, or by the
# job at the end when nothing timed out), expected.json (the right diagnosis), torchrun.log,
# analysis.json (our analyser, when pydantic is importable) and torch_fr_trace.txt (PyTorch's own
# analyser, for comparison). Copy the nccl_* directories into tests/fixtures/flight_recorder/ and
# tests/test_flight_recorder.py checks them automatically.
#
# Half the scenarios use the older env var names (TORCH_NCCL_TRACE_BUFFER_SIZE,
# TORCH_NCCL_DEBUG_INFO_TEMP_FILE) and half the current ones (TORCH_FR_BUFFER_SIZE,
# TORCH_FR_DUMP_TEMP_FILE); TORCH_NCCL_DUMP_ON_TIMEOUT=1 is read by both generations.
set -u
OUT=${OUT:-/tmp/fr-out}
cd "$(dirname "$0")/.."
NGPU=$(python -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
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
    healthy)     echo '{"culprit_ranks": [], "problems": ["none"]}' ;;
    hung)        echo "{\"culprit_ranks\": [$LAST], \"problems\": [\"missing_ranks\", \"no_dump\"]}" ;;
    op_mismatch) echo '{"culprit_ranks": [1], "problems": ["op_mismatch"]}' ;;
    skipped)     echo '{"culprit_ranks": [1], "problems": ["op_mismatch", "size_mismatch"]}' ;;
    subgroup)    echo "{\"culprit_ranks\": [$LAST], \"problems\": [\"missing_ranks\", \"no_dump\"]}" ;;
  esac
}

i=0
for scenario in healthy hung op_mismatch skipped subgroup; do
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
    timeout -k 10 150 python -m torch.distributed.run --standalone --nproc-per-node "$WORLD" \
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
echo "done: $OUT"
