"""The GPU table: datasheet sanity (dense rates), lookup by torch's names, hook specs win."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.measure.devices import (
    PEAK_KEYS,
    DeviceSpec,
    builtin_device_specs,
    find_device_spec,
    normalize_device_name,
)

SPECS = builtin_device_specs()


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_spec_is_complete_and_dense(spec: DeviceSpec) -> None:
    assert spec.arch.startswith("sm_")
    assert set(spec.peak_flops) <= set(PEAK_KEYS)
    assert {"fp32", "bf16_tensor", "fp16_tensor", "tf32_tensor"} <= set(spec.peak_flops)
    assert spec.source
    assert spec.aliases
    # Dense tensor rates keep the hardware's ratios: TF32 = BF16 / 2, FP8 = 2 x BF16. A rate
    # copied "with sparsity" for one dtype but not another breaks these.
    bf16 = spec.peak_flops["bf16_tensor"]
    assert spec.peak_flops["fp16_tensor"] == bf16
    assert spec.peak_flops["tf32_tensor"] == pytest.approx(bf16 / 2, rel=0.02)
    if "fp8_tensor" in spec.peak_flops:
        assert spec.peak_flops["fp8_tensor"] == pytest.approx(2 * bf16, rel=0.02)
    # dense BF16 tensor cores beat FP32 CUDA cores about 4x (Ada) to 30x (Blackwell)
    assert 3.5 * spec.peak_flops["fp32"] <= bf16 <= 40 * spec.peak_flops["fp32"]


def test_h200_numbers() -> None:
    h200 = find_device_spec("NVIDIA H200")
    assert h200 is not None
    assert h200.name == "NVIDIA H200 SXM"
    assert h200.dram_bandwidth_Bps == 4.8e12
    assert h200.peak_flops["bf16_tensor"] == pytest.approx(989e12, rel=0.01)
    assert h200.peak_flops["fp32"] == 67e12
    assert h200.peak_flops["fp64_tensor"] == 67e12
    assert (h200.sms, h200.arch) == (132, "sm_90")
    # the H200 is an H100 SXM with faster memory: same arithmetic, lower ridge
    h100 = find_device_spec("NVIDIA H100 80GB HBM3")
    assert h100 is not None
    assert h100.peak_flops == h200.peak_flops
    ridge_h200 = h200.peak_flops["bf16_tensor"] / h200.dram_bandwidth_Bps
    ridge_h100 = h100.peak_flops["bf16_tensor"] / h100.dram_bandwidth_Bps
    assert ridge_h200 == pytest.approx(206, abs=1)
    assert ridge_h100 == pytest.approx(295, abs=1)


def test_h100_sxm_and_pcie_differ() -> None:
    sxm = find_device_spec("NVIDIA H100 80GB HBM3")
    pcie = find_device_spec("NVIDIA H100 PCIe")
    assert sxm is not None
    assert pcie is not None
    assert sxm is not pcie
    assert (sxm.sms, pcie.sms) == (132, 114)
    assert sxm.dram_bandwidth_Bps == 3.35e12
    assert pcie.dram_bandwidth_Bps == 2.0e12
    assert sxm.peak_flops["bf16_tensor"] > pcie.peak_flops["bf16_tensor"]


@pytest.mark.parametrize(
    ("torch_name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
        ("NVIDIA H200", "NVIDIA H200 SXM"),
        ("nvidia h200", "NVIDIA H200 SXM"),
        ("NVIDIA H200 NVL", "NVIDIA H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM4 80GB"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 SXM4 40GB"),
        ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 PCIe 40GB"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe 80GB"),
        ("NVIDIA L4", "NVIDIA L4"),
        ("NVIDIA L40S", "NVIDIA L40S"),
        ("NVIDIA B200", "NVIDIA B200"),
    ],
)
def test_lookup_by_torch_device_name(torch_name: str, expected: str) -> None:
    spec = find_device_spec(torch_name)
    assert spec is not None
    assert spec.name == expected


@pytest.mark.parametrize(
    "name", ["NVIDIA GeForce RTX 4090", "NVIDIA L40", "NVIDIA H100 SXM5 64GB", ""]
)
def test_unknown_names_match_nothing(name: str) -> None:
    # no substring guessing: an L40 is not an L40S, an unknown H100 variant is not the SXM5 80GB
    assert find_device_spec(name) is None


def test_normalize_device_name() -> None:
    assert normalize_device_name("NVIDIA A100-SXM4-80GB") == "a100 sxm4 80gb"
    assert normalize_device_name("  nvidia  H200 ") == "h200"


def test_extra_spec_wins_over_builtin() -> None:
    builtin = find_device_spec("NVIDIA H200")
    assert builtin is not None
    team = dataclasses.replace(builtin, name="Team H200 (derated)", dram_bandwidth_Bps=4.0e12)
    found = find_device_spec("NVIDIA H200", extra=[team])
    assert found is team
    assert found.dram_bandwidth_Bps == 4.0e12
    # and a team's new GPU is found by its alias
    new = dataclasses.replace(builtin, name="NVIDIA H20", aliases=("NVIDIA H20",))
    assert find_device_spec("NVIDIA H20", extra=(new,)) is new
    assert find_device_spec("NVIDIA H20") is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"peak_flops": {"bf16": 1e12}}, "unknown peak_flops keys \\['bf16'\\]"),
        ({"peak_flops": {"fp32": -1.0}}, "peak_flops\\['fp32'\\]=-1.0"),
        ({"sms": 0}, "sms=0 must be a positive number"),
        ({"arch": "hopper"}, "arch 'hopper' is not like 'sm_90'"),
    ],
)
def test_bad_specs_are_rejected_with_the_value(changes: dict[str, object], message: str) -> None:
    base = find_device_spec("NVIDIA L4")
    assert base is not None
    with pytest.raises(KernelproConfigError, match=message):
        dataclasses.replace(base, **changes)


def test_devices_module_does_not_import_torch() -> None:
    code = (
        "import sys, pytest_kernelpro.measure.devices as d; "
        "assert d.find_device_spec('NVIDIA B200'); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_cpu_path_leaves_the_gpu_table_unimported() -> None:
    """The roofline, the FLOP counter and the ceilings need a DeviceSpec only on a GPU: a CPU
    item's ceilings (its cache target and cache read) never import the device table."""
    code = (
        "import sys, tempfile, pathlib; "
        "from pytest_kernelpro.measure import ceilings, roofline, flops; "
        "ceilings.cache_target('cpu', pathlib.Path(tempfile.mkdtemp())); "
        "assert 'pytest_kernelpro.measure.devices' not in sys.modules, 'device table imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
