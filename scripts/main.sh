#!/usr/bin/env bash
# The main job, as the CI workflow (.github/workflows/kernelpro-check.yml) runs it, on this
# machine: install; measure the example repository's kernels once as the baseline and once
# more as the head; gate the head against that baseline (--kernelpro-check, which also shows
# the table); then print the PR-comment Markdown and write the roofline plot. Both runs are
# measured here, so no baseline recorded on another machine decides anything. On the CPU
# the PyTorch kernels run; Triton and CUDA kernels skip with the reason.
#
# Extra arguments go to both pytest runs (e.g. `-k softmax`, `--kernelpro-cpu-threads=1`).
# Where it installs: a virtual environment of its own, .venv in the checkout (made by
# KERNELPRO_MAIN_PYTHON, default python3, when missing; KERNELPRO_MAIN_VENV=DIR puts it
# elsewhere), never the interpreter first on PATH. KERNELPRO_MAIN_NO_INSTALL=1 installs
# nothing and runs with KERNELPRO_MAIN_PYTHON (default python3), where the package is already.
# Everything lands in example_repo/.kernelpro/main/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${KERNELPRO_MAIN_NO_INSTALL:-0}" = 1 ]; then
  python=$(command -v "${KERNELPRO_MAIN_PYTHON:-python3}")
  echo "== kernelpro main job: installing nothing, running with $python"
else
  venv=$(realpath -m "${KERNELPRO_MAIN_VENV:-.venv}")
  if [ ! -x "$venv/bin/python" ]; then
    "${KERNELPRO_MAIN_PYTHON:-python3}" -m venv "$venv"
  fi
  python="$venv/bin/python"
  echo "== kernelpro main job: installing into the virtual environment $venv"
  "$python" -m pip install -q -c constraints-cpu.txt -e ".[torch]"
fi
cd example_repo
out=.kernelpro/main
rm -rf "$out"
mkdir -p "$out"

echo "== kernelpro main job: 1/3 baseline (the example's kernels, measured on this machine)"
# A kernel that fails here is not the head's fault: keep going, as the workflow does.
"$python" -m pytest -q --kernelpro-only \
  --kernelpro-save-baseline="$out/baseline.yaml" \
  --kernelpro-json="$out/base-report.json" "$@" || true
if [ ! -f "$out/baseline.yaml" ]; then
  echo "kernelpro main job: no baseline was written (no kernel passed, see above)" >&2
  exit 1
fi

echo "== kernelpro main job: 2/3 head, gated against that baseline"
# --kernelpro-allow-incomparable: this demo runs on any machine, a loaded laptop included,
# where every CPU verdict may read "unresolved" (the change cannot be told from the noise);
# the table still says so. A project's own CI job leaves it out, so that a check which
# resolved nothing fails.
set +e
"$python" -m pytest --kernelpro-only --kernelpro-check --kernelpro-allow-incomparable \
  --kernelpro-baseline="$out/baseline.yaml" \
  --kernelpro-json="$out/kernelpro-report.json" \
  --junitxml="$out/junit.xml" "$@"
rc=$?
set -e

echo "== kernelpro main job: 3/3 the PR comment and the roofline plot"
"$python" -m pytest_kernelpro.review.cli comment "$out/kernelpro-report.json" \
  --out "$out/comment.md" --plot "$out/roofline.png"
cat "$out/comment.md"
echo
echo "kernelpro main job: comment example_repo/$out/comment.md, plot example_repo/$out/roofline.png,"
echo "  report example_repo/$out/kernelpro-report.json; gate exit status $rc"
exit "$rc"
