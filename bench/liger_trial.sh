#!/usr/bin/env bash
# A user trial on a real repository: Liger-Kernel's Triton ops (RMSNorm as an nn.Module
# marked by assignment, SwiGLU, softmax, LayerNorm through their autograd.Functions), marked
# in bench/liger/test_kernelpro_liger.py, measured the way the README's main job does it:
# a baseline run, a --kernelpro-check run against it, the PR comment, then
# --kernelpro-profile on two of them (Nsight Compute, SASS read from Triton's cubins,
# guidance). Liger-Kernel is not committed: pass a checkout's root (its src/ is imported).
#
# usage: bench/liger_trial.sh LIGER_ROOT OUT_DIR
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
liger="$(cd "$1" && pwd)"
out="$2"
mkdir -p "$out"
work="$(mktemp -d)"
cp "$repo/bench/liger/test_kernelpro_liger.py" "$work/"
cd "$work"
export PYTHONPATH="$repo:$liger/src" PYTHONUNBUFFERED=1
# Where the package is installed its entry point loads the plugin (and a second `-p` of the
# same module is an error); the device runs it from the tree, so there it is named.
plugin=(-p pytest_kernelpro.plugin)
if python3 -c "import importlib.metadata as m, sys; sys.exit(not any(e.name == 'kernelpro' for e in m.entry_points(group='pytest11')))"; then
  plugin=()
fi
run() {  # name, then the pytest arguments; wall time and exit code into $out/steps.txt
  local name=$1; shift
  local start=$SECONDS
  timeout "${STEP_LIMIT_S:-150}" python3 -m pytest "${plugin[@]}" -p no:cacheprovider "$@" \
    >"$out/$name.log" 2>&1
  echo "$name rc=$? wall_s=$((SECONDS - start))" | tee -a "$out/steps.txt"
}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv \
  >"$out/env.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  >>"$out/env.txt" 2>&1
run baseline -q --kernelpro-save-baseline="$out/baseline.yaml" --kernelpro-json="$out/base-report.json"
run check --kernelpro-check --kernelpro-baseline="$out/baseline.yaml" \
  --kernelpro-json="$out/report.json" --junitxml="$out/junit.xml"
python3 -m pytest_kernelpro.cli comment "$out/report.json" --out "$out/comment.md" \
  --plot "$out/roofline.png" >"$out/comment.log" 2>&1
echo "comment rc=$?" | tee -a "$out/steps.txt"
STEP_LIMIT_S=${PROFILE_LIMIT_S:-200} run profile -rA --kernelpro-profile -k "swiglu or rms_norm" \
  --kernelpro-json="$out/profile-report.json"
cp -r .kernelpro "$out/kernelpro-dir" 2>/dev/null || true
