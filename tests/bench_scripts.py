"""The maintained benchmarks' scripts (`bench/`), loaded as modules for their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench_script(name: str) -> ModuleType:
    """`bench/<name>.py` as the module `kp_bench_<name>` (registered, so dataclasses and
    pickling inside it resolve their module)."""
    spec = importlib.util.spec_from_file_location(f"kp_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
