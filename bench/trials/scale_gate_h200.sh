#!/usr/bin/env bash
# Issue 10 on the H200 in one device call: the item limits (native-hang watchdog, isolate
# kill, profiler children after a large item), the KernelBench problems that were above 3x
# their footprint, the gate over the suite with both rules, then as much of the rest of
# KernelBench as fits. Each step has its own deadline; everything lands under $OUT
# (8 files at most come back).
#   bash bench/trials/scale_gate_h200.sh TOTAL_SECONDS   (run from the repository root)
set -u
TOTAL=${1:-420}
START=$(date +%s)
left() { echo $(( TOTAL - ($(date +%s) - START) )); }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
CEIL=bench/results/raw/2026-11-30-ceilings-h200-run1.json
LOG=$OUT/log.txt
mkdir -p "$OUT/limits" "$OUT/gate" "$OUT/sweep"
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"; date -u
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/gpu.txt" 2>&1
echo "== limits (left $(left) s)" | tee -a "$LOG"
timeout 150 python3 bench/trials/item_limits_gpu.py --out "$OUT/limits" --ceilings "$CEIL" 2>&1 | tee -a "$LOG"
echo "== sweep of the 19 (left $(left) s)" | tee -a "$LOG"
timeout 60 python3 bench/kernelbench_sweep.py --problems .kb/KernelBench --out "$OUT/sweep" \
  --deadline-s 45 --ceilings "$CEIL" \
  --select 'level1/(2|4|6|7|9|12|16|17|18|45|46|47|48|49|51|52|53|72|75)_' 2>&1 \
  | grep -v "^  " | tee -a "$LOG"
echo "== gate (left $(left) s)" | tee -a "$LOG"
GATE_MIN=${GATE_MIN:-2.5}
timeout $(( ${GATE_MIN%.*} * 60 + 80 )) python3 bench/gate_accuracy.py --device cuda --out "$OUT/gate" \
  --max-minutes "$GATE_MIN" --long-only --ceilings "$CEIL" 2>&1 | tail -80 | tee -a "$LOG"
REST=$(( $(left) - 25 ))
echo "== sweep of the rest, deadline $REST s (left $(left) s)" | tee -a "$LOG"
if [ "$REST" -gt 20 ]; then
  timeout $(( REST + 20 )) python3 bench/kernelbench_sweep.py --problems .kb/KernelBench \
    --out "$OUT/sweep" --deadline-s "$REST" --ceilings "$CEIL" 2>&1 | grep -v "^  " | tail -40 | tee -a "$LOG"
fi
echo "== done (left $(left) s)" | tee -a "$LOG"
tail -30 "$OUT/sweep/sweep.md" 2>/dev/null | head -5
grep -E "PASS|FAIL" "$LOG" | head -20
