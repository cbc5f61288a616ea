#!/usr/bin/env bash
# On the H200: the example repository under the plugin (save a baseline, gate against it,
# profile), plus the foundation benchmark. Everything lands in $OUT/results.tgz.
# Usage (device tool): bash bench/trials/h200_examples.sh
set -u
source bench/device_setup.sh
R=/tmp/kp-results; rm -rf "$R"; mkdir -p "$R/ex"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$R/nvidia-smi.txt"
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS; timeout "$limit" "$@" > "$R/$name.log" 2>&1; echo "$name rc=$? wall_s=$((SECONDS - t0))" | tee -a "$R/steps.txt"; }
step foundation 200 python bench/foundation_h200.py --out "$R/foundation" --budget 2
cd example_repo
step ex_save 150 python -m pytest -p no:cacheprovider -q --kernelpro-save-baseline="$R/ex/baseline.yaml" --kernelpro-json="$R/ex/save.json"
step ex_check 100 python -m pytest -p no:cacheprovider -q --kernelpro-check --kernelpro-baseline="$R/ex/baseline.yaml" --kernelpro-json="$R/ex/check.json" --junitxml="$R/ex/junit.xml"
step ex_profile 150 python -m pytest -p no:cacheprovider -q -rA --kernelpro-profile -k "cuda_saxpy or cuda_row_rms or triton_softmax or softmax_rows" --kernelpro-json="$R/ex/profile.json"
cd ..
step gate_accuracy 230 python bench/gate_accuracy.py --device cuda --out "$R/gate" --max-minutes 3.3
tar czf "$OUT/results.tgz" -C "$R" .
tail -n 12 "$R/foundation.log"; tail -n 14 "$R/ex_check.log"; tail -n 12 "$R/gate_accuracy.log"; cat "$R/steps.txt"
