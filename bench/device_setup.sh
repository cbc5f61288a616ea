#!/usr/bin/env bash
# Source this on the device machine (no network, no build backend needed): makes the
# working tree importable and registers the pytest11 entry point through a dist-info.
# Usage: source bench/device_setup.sh
export PYTHONUNBUFFERED=1
site=/tmp/kp-site
mkdir -p "$site/pytest_kernelpro_dev-0.1.0.dist-info"
printf 'Metadata-Version: 2.1\nName: pytest-kernelpro\nVersion: 0.1.0\n' > "$site/pytest_kernelpro_dev-0.1.0.dist-info/METADATA"
# The entry points come from pyproject.toml itself, so this copy never drifts from it.
python3 - "$site/pytest_kernelpro_dev-0.1.0.dist-info/entry_points.txt" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
with open(sys.argv[1], "w") as handle:
    for group, entries in groups.items():
        handle.write(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n")
PY
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import importlib.metadata as m; print('kernelpro entry points:', [e.value for e in m.entry_points(group='pytest11') if e.name.startswith('kernelpro')])"
