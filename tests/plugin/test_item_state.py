"""The item's state (run/context.py `ItemRun`) is built once per item and the stages read it:
the session is asked for the device, the ceilings, the device's table entry and the baseline
once per item, whatever the stages do; a failure to get the ceilings is kept for the stage
that needs them."""

from __future__ import annotations

import json

import pytest

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.run.context import DeviceModel

KERNELS = """
import pytest, torch

def vec(device):
    return (torch.randn(4096, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=vec)
def neg(x):
    return -x

@pytest.mark.kernelpro(reference=torch.abs, inputs=vec)
def absolute(x):
    return x.abs()
"""

# Counts the session's lookups per pytest run (the session is the plugin registered as
# "kernelpro-session"; its methods are wrapped on the instance after it is configured).
COUNTING_CONFTEST = """
import json
import pytest

LOOKUPS = ("choose_device", "ceilings_for", "spec_for", "baseline")
CALLS = {}


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    CALLS.clear()
    session = config.pluginmanager.get_plugin("kernelpro-session")
    for name in LOOKUPS:
        original = getattr(session, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            CALLS[_name] = CALLS.get(_name, 0) + 1
            return _original(*args, **kwargs)

        setattr(session, name, counted)


def pytest_unconfigure(config):
    with open("lookups.json", "w") as handle:
        json.dump(CALLS, handle)
"""


def _lookups(kp_project: pytest.Pytester, *args: str, passed: int) -> dict[str, int]:
    kp_project.runpytest("-p", "no:randomly", *args).assert_outcomes(passed=passed)
    return json.loads((kp_project.path / "lookups.json").read_text())


def test_a_checked_item_asks_the_session_once_for_each_part_of_its_state(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(test_k=KERNELS)
    kp_project.makeconftest(COUNTING_CONFTEST)
    saved = _lookups(kp_project, "--kernelpro-save-baseline", passed=2)
    # Saving a baseline gates nothing: no baseline lookup per item.
    assert saved == {"choose_device": 2, "ceilings_for": 2, "spec_for": 2}
    checked = _lookups(kp_project, "--kernelpro-check", passed=2)
    # Two items: each chose its device, got the ceilings and table entry, and looked its
    # baseline entry up once (the roofline and gate stages read the item's state).
    assert checked == {"choose_device": 2, "ceilings_for": 2, "spec_for": 2, "baseline": 2}


def test_a_correctness_only_item_still_gets_its_state_but_no_baseline(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(test_k=KERNELS)
    kp_project.makeconftest(COUNTING_CONFTEST)
    lookups = _lookups(kp_project, "--kernelpro-correctness-only", passed=2)
    assert lookups == {"choose_device": 2, "ceilings_for": 2, "spec_for": 2}


def test_unreadable_ceilings_fail_the_item_at_its_roofline_naming_the_file(
    kp_project: pytest.Pytester,
) -> None:
    """The ceilings are got before the item's clock starts; their failure is kept in the
    item's state and fails the item where the roofline needs them, with the file and the
    fix, and only there: a correctness-only run never needs them and passes."""
    kp_project.makepyfile(test_k=KERNELS)
    (kp_project.path / "ceilings.json").write_text("{not json", encoding="utf-8")
    result = kp_project.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["*ceilings file *ceilings.json* is unreadable*kernelpro calibrate --out*"]
    )
    kp_project.runpytest("--kernelpro-correctness-only").assert_outcomes(passed=2)


def test_the_device_model_gives_its_ceilings_or_raises_the_kept_error() -> None:
    ceilings = object()
    assert DeviceModel(ceilings, None).require() == (ceilings, None)  # type: ignore[arg-type]
    kept = KernelproError("the ceilings of cpu could not be measured: OSError")
    with pytest.raises(KernelproError) as raised:
        DeviceModel(None, None, kept).require()
    assert raised.value is kept
