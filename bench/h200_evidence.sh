#!/usr/bin/env bash
# The H200 evidence for the trust work, one resumable stage runner: each stage writes its
# output under $OUT/<stage>/ and a `done` file; a stage whose `done` exists is skipped, so the
# same command goes on from where the last device call (at most 10 minutes) stopped.
#
#   source bench/device_setup.sh && bash bench/h200_evidence.sh [STAGE ...]
#
# With no STAGE every stage runs in order. KERNELBENCH=DIR names a KernelBench checkout
# (level1/ level2/ level3/) carried to the device machine; its stages are skipped without it.
# Results are summarized by hand into bench/results/<date>-h200-evidence-h200.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder the device call brings back}
PY=${PYTHON:-python}

stage() {  # stage NAME COMMAND...: run COMMAND once, its output in $OUT/NAME/log
  local name=$1
  shift
  local dir="$OUT/$name"
  if [ -e "$dir/done" ]; then
    echo "== $name: done earlier, skipped"
    return 0
  fi
  mkdir -p "$dir"
  echo "== $name: $*"
  local start=$SECONDS
  "$@" >"$dir/log" 2>&1
  local rc=$?
  echo "rc=$rc wall_s=$((SECONDS - start))" >"$dir/status"
  [ "$rc" = 0 ] && touch "$dir/done"
  tail -n 5 "$dir/log"
  return 0
}

gpu_tests() { KERNELPRO_FORCE_GPU_TESTS=1 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests; }
main_job() { bash scripts/main.sh; }
honest() { "$PY" bench/honest_measurement_h200.py --out "$OUT/honest"; }
gate_accuracy() { "$PY" bench/gate_accuracy.py --device cuda --out "$OUT/gate_accuracy"; }
kernelbench() {
  "$PY" bench/kernelbench_sweep.py --problems "$KERNELBENCH" --out "$OUT/kernelbench" \
    --deadline-s 540
}
reference_truth() {
  "$PY" bench/reference_truth.py --problems "$KERNELBENCH" --out "$OUT/reference_truth"
}
autotune() { "$PY" bench/autotune_gate.py --rounds 5 --out "$OUT/autotune"; }
sandbox() { "$PY" bench/sandbox_h200.py --security --out "$OUT/sandbox"; }
optimizer_at_size() { "$PY" bench/optimizer_speed.py --out "$OUT/optimizer_at_size"; }

ALL=(gpu_tests main_job honest gate_accuracy autotune sandbox optimizer_at_size)
[ -n "${KERNELBENCH:-}" ] && ALL+=(kernelbench reference_truth)
for name in "${@:-${ALL[@]}}"; do
  stage "$name" "$name"
done
