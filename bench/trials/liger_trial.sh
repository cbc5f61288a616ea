#!/usr/bin/env bash
# A user trial on a real repository: Liger-Kernel's Triton ops, marked in
# bench/trials/liger/test_kernelpro_liger.py (RMSNorm as an nn.Module marked by assignment with
# dtype=bf16, SwiGLU, softmax and LayerNorm through their autograd.Functions), used the way
# the README says, from the Liger checkout's root (its own pyproject's pytest settings,
# `pythonpath = ["src", "."]`):
#   1. a baseline run, 2. --kernelpro-check against it, 3. the PR comment and plot,
#   4. --kernelpro-profile of two kernels (Nsight Compute, SASS from Triton's cubins),
#   5. --kernelpro-optimize of rms_norm with the hand-written replay corpus in
#      bench/trials/liger/replays (a PyTorch candidate, a fused Triton one answering its profile, a wrong one), then
#   6. best.patch applied with `git apply` in a fresh clone and --kernelpro-check there
#      against the baseline of step 1.
# Liger-Kernel is not committed: pass a git checkout of it.
#
# usage: bench/trials/liger_trial.sh LIGER_CHECKOUT OUT_DIR   (at most 8 files land in OUT_DIR:
#        steps.txt, summary.txt, comment.md and everything else in trial.tgz)
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
liger_src="$(cd "$1" && pwd)"
out="$2"
[ -n "${BASELINE:-}" ] && BASELINE="$(cd "$(dirname "$BASELINE")" && pwd)/$(basename "$BASELINE")"
mkdir -p "$out"
work="$(mktemp -d)"
logs="$work/logs"
mkdir -p "$logs"
git clone -q "$liger_src" "$work/liger"
cd "$work/liger"
mkdir -p kernels
cp "$repo/bench/trials/liger/test_kernelpro_liger.py" kernels/
git add kernels && git -c user.name=trial -c user.email=trial@localhost commit -qm "kernelpro items" || true
export PYTHONPATH="$repo" PYTHONUNBUFFERED=1
# Where the package is installed its entry point loads the plugin (and a second `-p` of the
# same module is an error); the device runs it from the tree, so there it is named.
plugin=(-p pytest_kernelpro.plugin)
if python3 -c "import importlib.metadata as m, sys; sys.exit(not any(e.name == 'kernelpro' for e in m.entry_points(group='pytest11')))"; then
  plugin=()
fi
run() {  # name, then the pytest arguments; wall time and exit code into steps.txt
  local name=$1; shift
  local start=$SECONDS
  timeout "${STEP_LIMIT_S:-150}" python3 -m pytest "${plugin[@]}" -p no:cacheprovider "$@" \
    >"$logs/$name.log" 2>&1
  echo "$name rc=$? wall_s=$((SECONDS - start))" | tee -a "$out/steps.txt"
}
{
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git -C "$liger_src" log --oneline -1
} >"$logs/env.txt" 2>&1
# STEPS picks what runs (default all); BASELINE reuses a baseline of an earlier run of this
# script on the same kind of machine instead of measuring one.
steps=" ${STEPS:-baseline check profile optimize} "
base="$logs/baseline.yaml"
if [ -n "${BASELINE:-}" ]; then
  cp "$BASELINE" "$base"
fi
if [[ $steps == *" baseline "* ]]; then
  run baseline kernels -q --kernelpro-save-baseline="$base" --kernelpro-json="$logs/base-report.json"
fi
if [[ $steps == *" check "* ]]; then
  run check kernels --kernelpro-check --kernelpro-baseline="$base" \
    --kernelpro-json="$logs/report.json" --junitxml="$logs/junit.xml"
  python3 -m pytest_kernelpro.cli comment "$logs/report.json" --out "$out/comment.md" \
    --plot "$logs/roofline.png" >"$logs/comment.log" 2>&1
  echo "comment rc=$?" | tee -a "$out/steps.txt"
fi
if [[ $steps == *" profile "* ]]; then
  STEP_LIMIT_S=${PROFILE_LIMIT_S:-200} run profile kernels -rA --kernelpro-profile \
    -k "${PROFILE_SELECT:-swiglu or rms_norm}" --kernelpro-json="$logs/profile-report.json"
fi
[[ $steps == *" optimize "* ]] && STEP_LIMIT_S=${OPTIMIZE_LIMIT_S:-240} run optimize kernels -k rms_norm --kernelpro-optimize=3 \
  --kernelpro-llm="replay:$repo/bench/trials/liger/replays" --kernelpro-feedback=tools \
  --kernelpro-json="$logs/optimize-report.json"
patch="$(ls -t .kernelpro/optimize/rms_norm/*/patches/best.patch 2>/dev/null | head -1)"
if [ -n "$patch" ]; then
  git clone -q "$work/liger" "$work/fresh"
  cp "$patch" "$logs/best.patch"
  (cd "$work/fresh" && git apply "$logs/best.patch" && git status --short) >"$logs/apply.log" 2>&1
  echo "apply rc=$?" | tee -a "$out/steps.txt"
  (cd "$work/fresh" && run recheck kernels -k rms_norm --kernelpro-check \
    --kernelpro-baseline="$base" --kernelpro-json="$logs/recheck-report.json")
else
  echo "apply skipped: no best.patch" | tee -a "$out/steps.txt"
fi
cp -r .kernelpro "$logs/kernelpro-dir" 2>/dev/null
{
  for f in check profile optimize recheck; do
    echo "=== $f"
    grep -E "kernel\(s\)|µs|ms ±|FAILED|PASSED|sass read|speedup|improv|wall:|re-measurement|best\.patch|optimize" \
      "$logs/$f.log" 2>/dev/null | head -60
  done
} >"$out/summary.txt"
tar czf "$out/trial.tgz" -C "$work" logs 2>/dev/null
