"""The plugin's exceptions and warning (`pytest_kernelpro/errors.py`)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from pytest_kernelpro.errors import KernelproConfigError, KernelproError, KernelproWarning


def test_the_warning_is_a_pytest_warning() -> None:
    """A project's `filterwarnings` for pytest's warnings covers the plugin's too."""
    assert issubclass(KernelproWarning, pytest.PytestWarning)
    assert KernelproWarning.__module__ == "pytest_kernelpro.errors"
    with pytest.warns(pytest.PytestWarning, match="not measured"):
        warnings.warn("not measured", KernelproWarning, stacklevel=1)
    assert issubclass(KernelproConfigError, KernelproError)


def test_importing_the_errors_does_not_import_pytest() -> None:
    """The sandbox's workers, judges and re-measurement processes import the errors but never
    run pytest: `pytest` itself stays unloaded (its warning base comes from the module that
    defines it)."""
    code = (
        "import sys\n"
        "from pytest_kernelpro.errors import KernelproError, KernelproWarning\n"
        "print('pytest' in sys.modules, KernelproWarning.__mro__[1].__module__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["False", "pytest"]


def test_importing_a_name_runs_no_code_of_the_module() -> None:
    """`from pytest_kernelpro.errors import X` is a plain attribute read: the module has no
    module-level `__getattr__` that every such import would call (importlib looks `__path__`
    up on it)."""
    import pytest_kernelpro.errors as errors

    assert "__getattr__" not in vars(errors)
