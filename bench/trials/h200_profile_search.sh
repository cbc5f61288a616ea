#!/usr/bin/env bash
# On the H200: the profiling capture of ~12 kernels (issues 3, 4) and the sandboxed
# evaluator on real candidates (issue 5). Everything lands in $OUT/results.tgz.
set -u
source bench/device_setup.sh
R=/tmp/kp-results; rm -rf "$R"; mkdir -p "$R"
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS; timeout "$limit" "$@" > "$R/$name.log" 2>&1; echo "$name rc=$? wall_s=$((SECONDS - t0))" | tee -a "$R/steps.txt"; }
KP_PROFILE_DEADLINE_S=230 step profile_capture 320 python bench/profile_capture.py --out "$R/profile_capture"
step evaluator_gpu 260 python bench/evaluator_gpu.py --out "$R/evaluator"
tar czf "$OUT/results.tgz" -C "$R" .
tail -n 25 "$R/profile_capture.log"; tail -n 20 "$R/evaluator_gpu.log"; cat "$R/steps.txt"
