#!/usr/bin/env bash
# The main job, as the CI workflow (.github/workflows/kernelpro-check.yml) runs it, on this
# machine: install; measure the example repository's kernels once as the baseline and once
# more as the head; gate the head against that baseline (--kernelpro-check, which also shows
# the table); then print the PR-comment Markdown and write the roofline plot. Both runs are
# measured here, so no baseline recorded on another machine decides anything. On the CPU
# the PyTorch kernels run; Triton and CUDA kernels skip with the reason.
#
# Extra arguments go to both pytest runs (e.g. `-k softmax`, `--kernelpro-cpu-threads=1`).
# KERNELPRO_MAIN_NO_INSTALL=1 skips the pip install (the package is installed already).
# Everything lands in example_repo/.kernelpro/main/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${KERNELPRO_MAIN_NO_INSTALL:-0}" != 1 ]; then
  python3 -m pip install -q -c constraints-cpu.txt -e ".[torch]"
fi
cd example_repo
out=.kernelpro/main
rm -rf "$out"
mkdir -p "$out"

echo "== kernelpro main job: 1/3 baseline (the example's kernels, measured on this machine)"
# A kernel that fails here is not the head's fault: keep going, as the workflow does.
python3 -m pytest -q --kernelpro-only \
  --kernelpro-save-baseline="$out/baseline.yaml" \
  --kernelpro-json="$out/base-report.json" "$@" || true
if [ ! -f "$out/baseline.yaml" ]; then
  echo "kernelpro main job: no baseline was written (no kernel passed, see above)" >&2
  exit 1
fi

echo "== kernelpro main job: 2/3 head, gated against that baseline"
set +e
python3 -m pytest --kernelpro-only --kernelpro-check \
  --kernelpro-baseline="$out/baseline.yaml" \
  --kernelpro-json="$out/kernelpro-report.json" \
  --junitxml="$out/junit.xml" "$@"
rc=$?
set -e

echo "== kernelpro main job: 3/3 the PR comment and the roofline plot"
python3 -m pytest_kernelpro.cli comment "$out/kernelpro-report.json" \
  --out "$out/comment.md" --plot "$out/roofline.png"
cat "$out/comment.md"
echo
echo "kernelpro main job: comment example_repo/$out/comment.md, plot example_repo/$out/roofline.png,"
echo "  report example_repo/$out/kernelpro-report.json; gate exit status $rc"
exit "$rc"
