#!/usr/bin/env bash
# The H200 evidence for the trust work, one resumable stage runner over several device calls.
#
#   source bench/device_setup.sh && bash bench/h200_evidence.sh [STAGE ...]
#
# Each stage writes under $EVID/<stage>/ (log, status, its bench's files) and a `done` file;
# a stage whose `done` exists is skipped. A device call brings back at most 8 files and
# empties $OUT before the next one, so after every stage the whole of $EVID is packed into
# $OUT/evidence.tgz; carry that archive back as .devstage/evidence.tgz (ignored by git) and
# the next call unpacks it first and goes on where the last one stopped.
#
# CALL_S (default 570) is the call's own limit: a stage gets the time left (less a margin for
# packing), is skipped when under MIN_STAGE_S remain, and a stage cut short is not done.
# KERNELBENCH=DIR names a KernelBench checkout (level1/ level2/ level3/); its stages are
# skipped without it. Results are summarized by hand into bench/results/<date>-*-h200.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:?set OUT to the folder the device call brings back}
PY=${PYTHON:-python3}
EVID=${EVID:-/tmp/kp-evidence}
CALL_S=${CALL_S:-570}
MIN_STAGE_S=${MIN_STAGE_S:-45}
PACK_MARGIN_S=20
mkdir -p "$EVID"
if [ -f .devstage/evidence.tgz ] && [ ! -e "$EVID/.unpacked" ]; then
  tar xzf .devstage/evidence.tgz -C "$EVID" && touch "$EVID/.unpacked"
fi

pack() {  # the whole evidence folder as one archive under $OUT, replaced atomically
  tar czf "$OUT/evidence.tgz.part" -C "$EVID" --exclude=.unpacked . &&
    mv "$OUT/evidence.tgz.part" "$OUT/evidence.tgz"
}

stage() {  # stage NAME: run the function NAME once within the time left
  local name=$1
  local dir="$EVID/$name"
  if [ -e "$dir/done" ]; then
    echo "== $name: done earlier, skipped"
    return 0
  fi
  local left=$((CALL_S - SECONDS - PACK_MARGIN_S))
  if [ "$left" -lt "$MIN_STAGE_S" ]; then
    echo "== $name: ${left}s left in this call, left for the next"
    return 0
  fi
  mkdir -p "$dir"
  echo "== $name (at most ${left}s)"
  local start=$SECONDS
  STAGE_LEFT_S=$left timeout --kill-after=10 "$left" bash -c "$(declare -f "$name"); $name" \
    >"$dir/log" 2>&1
  local rc=$?
  echo "rc=$rc wall_s=$((SECONDS - start)) date=$(date -u +%FT%TZ)" >>"$dir/status"
  [ "$rc" = 0 ] && touch "$dir/done"
  tail -n 6 "$dir/log"
  pack
}

gpu_tests() { KERNELPRO_FORCE_GPU_TESTS=1 $PY -m pytest -m gpu -q -p no:cacheprovider -rfEs tests; }
main_job() { KERNELPRO_MAIN_NO_INSTALL=1 bash scripts/main.sh; }
honest() { $PY bench/honest_measurement_h200.py --out "$EVID/honest"; }
gate_accuracy() { $PY bench/gate_accuracy.py --suite plugin --device cuda --out "$EVID/gate_accuracy"; }
kernelbench() {
  $PY bench/kernelbench_sweep.py --problems "$KERNELBENCH" --out "$EVID/kernelbench" \
    --deadline-s $((STAGE_LEFT_S - 60))
}
autotune() {
  $PY bench/autotune_gate.py --rounds 5 --out "$EVID/autotune" --deadline $((STAGE_LEFT_S - 20))
}
sandbox() { $PY bench/sandbox_h200.py --security --out "$EVID/sandbox"; }
optimizer_at_size() { $PY bench/optimizer_speed.py --out "$EVID/optimizer_at_size"; }
optimizer_search() {  # the five-evaluation search of 23_Softmax alone, to its ranking
  $PY bench/optimizer_speed.py --out "$EVID/optimizer_search" --steps search \
    --deadline-s $((STAGE_LEFT_S - 30))
}
export PY EVID KERNELBENCH="${KERNELBENCH:-}"

ALL=(gpu_tests main_job honest sandbox gate_accuracy autotune optimizer_at_size optimizer_search)
[ -n "${KERNELBENCH:-}" ] && ALL+=(kernelbench)
echo "device: $(nvidia-smi --query-gpu=name,driver_version,temperature.gpu,power.draw,memory.used --format=csv,noheader 2>&1)"
echo "software: $($PY -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)' 2>&1 | tail -n 1)"
echo "code: $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-80)"
for name in "${@:-${ALL[@]}}"; do
  stage "$name"
done
pack
for dir in "$EVID"/*/; do
  printf '%-20s %s %s\n' "$(basename "$dir")" "$([ -e "$dir/done" ] && echo "done" || echo open)" \
    "$(tail -n 1 "$dir/status" 2>/dev/null)"
done
