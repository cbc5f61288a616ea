#!/usr/bin/env bash
# On the H200: the optimize loop end to end on three kernels (bench/trials/optimize_loop.py).
# Results: $OUT/optimize_loop.tgz (repo artifacts: trajectories, LLM recordings, rankings,
# JSON report) and $OUT/summary.json, $OUT/pytest.log.
set -u
source bench/device_setup.sh
R=/tmp/kp-ol; rm -rf "$R"; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$R/gpu.txt" 2>&1
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$R/gpu.txt" 2>&1
ncu --version | tail -1 >> "$R/gpu.txt" 2>&1
KERNELPRO_BENCH_ISOLATION="${KERNELPRO_BENCH_ISOLATION:-}" timeout "${KP_OL_TIMEOUT:-180}" python bench/trials/optimize_loop.py --out "$R" --timeout "${KP_OL_PYTEST_TIMEOUT:-170}" "$@" > "$R/bench.log" 2>&1
echo "bench rc=$?" >> "$R/bench.log"
cp "$R/summary.json" "$R/pytest.log" "$R/bench.log" "$R/gpu.txt" "$OUT/" 2>/dev/null
tar czf "$OUT/optimize_loop.tgz" -C "$R" --exclude='__pycache__' .
cat "$R/gpu.txt"; tail -40 "$R/bench.log"
