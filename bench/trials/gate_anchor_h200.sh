#!/usr/bin/env bash
# Issue 10, session 5: the per-sample clock anchor on the H200 in one device call. The GPU
# tests of the anchor, a smoke measurement (an 8192^2 bf16 GEMM timed with the anchor on: if
# it fails, the gate run is skipped so the call ends early), then bench/gate_accuracy.py over
# the 7 capped kernels and 3 steady ones with four rules on the same measurements and the
# anchor's timing cost (--cost-reps). Everything lands under $OUT.
#   bash bench/trials/gate_anchor_h200.sh GATE_MINUTES   (run from the repository root; KERNELS and
#   RULES in the environment replace the default kernels and rules)
set -u -o pipefail
MINUTES=${1:-3.6}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
CEIL=bench/results/raw/2026-11-30-ceilings-h200-run1.json
KERNELS=${KERNELS:-gemm_fp16_4096,gemm_bf16_8192_power,gemm_tf32_4096,sdpa_fp16_2048,bmm_bf16_512,conv3x3_fp16_nhwc,conv3x3_fp32_tf32,softmax_fp32,layer_norm_bf16,rms_norm_fp32}
RULES=${RULES:-anchor,anchor20,clock3x,fixed}
mkdir -p "$OUT/gate"
LOG=$OUT/call.log
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"; date -u
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/gpu.txt" 2>&1
echo "== gpu tests $(date -u +%T)" | tee -a "$LOG"
timeout 90 python3 -m pytest -q -p no:cacheprovider -rs tests/measure/test_timing_anchor.py 2>&1 \
  | tail -15 | tee -a "$LOG"
echo "== smoke $(date -u +%T)" | tee -a "$LOG"
if ! timeout 60 python3 - <<'PY' 2>&1 | tee -a "$LOG"; then
import torch
from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
r = time_kernel(lambda: a @ a, device="cuda", budget=TimingBudget(warmup_ms=300, clock_anchor="on"))
p = r.anchor or {}
print("median us", round(r.median_s * 1e6, 1), "samples", len(r.samples_s), "throttled",
      r.throttled_samples, "warmup_throttled", r.warmup_throttled, "sm",
      (r.clocks or {}).get("sm_mhz_mean"), "wall", round(r.wall_s, 3))
print("anchor", p.get("name"), "pairs", p.get("pairs"), "ratio", p.get("ratio_median"),
      "anchor us", (p.get("anchor_median_s") or 0) * 1e6, "added ms", (p.get("added_gpu_s") or 0) * 1e3)
assert r.anchor is not None, "the capped GEMM was not anchored"
PY
  echo "SMOKE FAILED: gate run skipped" | tee -a "$LOG"
  exit 1
fi
echo "== gate $(date -u +%T)" | tee -a "$LOG"
python3 bench/gate_accuracy.py --device cuda --out "$OUT/gate" --max-minutes "$MINUTES" \
  --min-trials 2 --wide-trials 1 --rules "$RULES" --cost-reps 2 \
  --only "$KERNELS" --ceilings "$CEIL" > "$OUT/gate/stdout.txt" 2> "$OUT/gate/gate.log"
echo "gate exit $? $(date -u +%T)" | tee -a "$LOG"
grep "^\[gate\]" "$OUT/gate/gate.log" | tee -a "$LOG"
