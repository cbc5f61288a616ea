#!/usr/bin/env bash
# Source this on the device machine (no network, no build backend needed): makes the
# working tree importable and registers the pytest11 entry point through a dist-info.
# Usage: source bench/device_setup.sh
export PYTHONUNBUFFERED=1
site=/tmp/kp-site
mkdir -p "$site/pytest_kernelpro_dev-0.1.0.dist-info"
printf 'Metadata-Version: 2.1\nName: pytest-kernelpro\nVersion: 0.1.0\n' > "$site/pytest_kernelpro_dev-0.1.0.dist-info/METADATA"
printf '[pytest11]\nkernelpro = pytest_kernelpro.plugin\n\n[console_scripts]\nkernelpro = pytest_kernelpro.cli:main\n' > "$site/pytest_kernelpro_dev-0.1.0.dist-info/entry_points.txt"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import importlib.metadata as m; print('kernelpro entry point:', [e.value for e in m.entry_points(group='pytest11') if e.name == 'kernelpro'])"
