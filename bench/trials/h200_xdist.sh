#!/usr/bin/env bash
# On a 2-GPU H200 machine: pytest-xdist scale-out of the example repository (one GPU per
# worker, merged report), and the refusal of more workers than GPUs.
set -u
source bench/device_setup.sh
R=/tmp/kp-xdist; rm -rf "$R"; mkdir -p "$R"
nvidia-smi -L | tee "$R/gpus.txt"
cd example_repo
t0=$SECONDS; timeout 200 python -m pytest -p no:cacheprovider -n 2 -q --kernelpro-save-baseline="$R/baseline.yaml" --kernelpro-json="$R/save.json" > "$R/save.log" 2>&1; echo "save rc=$? wall_s=$((SECONDS-t0))" | tee -a "$R/steps.txt"
t0=$SECONDS; timeout 120 python -m pytest -p no:cacheprovider -n 2 -q --kernelpro-check --kernelpro-baseline="$R/baseline.yaml" --kernelpro-json="$R/check.json" --junitxml="$R/junit.xml" > "$R/check.log" 2>&1; echo "check rc=$? wall_s=$((SECONDS-t0))" | tee -a "$R/steps.txt"
timeout 60 python -m pytest -p no:cacheprovider -n 3 -q > "$R/n3.log" 2>&1; echo "n3 rc=$?" | tee -a "$R/steps.txt"
python - "$R" <<'PY'
import json, sys
r = sys.argv[1]
rep = json.load(open(f"{r}/check.json"))
recs = rep["records"]
print("records in merged report:", len(recs))
for x in recs:
    print(f"{x['name']:24s} {x['outcome']:8s} device={x['device']:28s} gpu={x['extra'].get('cuda_visible_devices')} worker={x['extra'].get('xdist_worker')} verdict={(x.get('gate') or {}).get('status')}")
PY
cd ..; tar czf "$OUT/xdist.tgz" -C "$R" .
tail -n 14 "$R/check.log"; tail -n 4 "$R/n3.log"; cat "$R/steps.txt"
