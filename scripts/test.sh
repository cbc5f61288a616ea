#!/usr/bin/env bash
# Install what the tests need (CPU torch pinned by constraints-cpu.txt) and run them.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -c constraints-cpu.txt -e ".[test]"
bash scripts/install-actionlint.sh || echo "actionlint not installed; workflow lint tests will skip"
ruff check .
python3 -m pytest -n 2 -q tests
