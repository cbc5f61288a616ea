#!/usr/bin/env bash
# The main job: install, then gate the example repository's kernels with --kernelpro-check
# (on the CPU where there is no GPU: the PyTorch kernels run, GPU kernels skip with a reason).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -c constraints-cpu.txt -e ".[torch]"
cd example_repo
python3 -m pytest --kernelpro-check "$@"
