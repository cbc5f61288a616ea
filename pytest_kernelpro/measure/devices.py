"""The device model: a GPU's datasheet ceilings (`DeviceSpec`) and the lookup of the built-in
table (`device_table.py`) by the name torch reports.

Numbers here are leads, not ceilings: the roofline uses the rates measured on the machine
(`ceilings.py`) and falls back to these only for what it did not measure. Every tensor-core
rate is DENSE: NVIDIA's datasheets quote tensor rates "with sparsity" (2:4 structured), which
is twice the dense rate, so those numbers are halved here and the `source` says so.

No torch import: the plugin reads the table at collection time.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pytest_kernelpro.errors import KernelproConfigError

#: The peak keys a spec may carry (FLOP/s; "int8_tensor" is ops/s).
PEAK_KEYS: tuple[str, ...] = (
    "fp64",
    "fp64_tensor",
    "fp32",
    "tf32_tensor",
    "fp16_tensor",
    "bf16_tensor",
    "fp8_tensor",
    "int8_tensor",
)

_ARCH_RE = re.compile(r"^sm_\d+[a-z]?$")


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU model's datasheet numbers; `aliases` are compared with
    `torch.cuda.get_device_name()` as `normalize_device_name` makes them, never by substring,
    so "NVIDIA H100 NVL" can never be mistaken for an H100 SXM."""

    name: str
    aliases: tuple[str, ...]
    arch: str
    sms: int
    dram_bandwidth_Bps: float
    peak_flops: Mapping[str, float]
    source: str
    notes: str = ""

    def __post_init__(self) -> None:
        where = f"device spec {self.name!r}"
        if not self.name:
            raise KernelproConfigError("device spec has an empty name; give it the GPU's name")
        if not _ARCH_RE.match(self.arch):
            raise KernelproConfigError(
                f"{where}: arch {self.arch!r} is not like 'sm_90'; use the sm_XY form"
            )
        for attr in ("sms", "dram_bandwidth_Bps"):
            value = getattr(self, attr)
            if not isinstance(value, (int, float)) or value <= 0:
                raise KernelproConfigError(f"{where}: {attr}={value!r} must be a positive number")
        unknown = sorted(set(self.peak_flops) - set(PEAK_KEYS))
        if unknown:
            raise KernelproConfigError(
                f"{where}: unknown peak_flops keys {unknown}; use only {list(PEAK_KEYS)}"
            )
        for key, value in self.peak_flops.items():
            if not isinstance(value, (int, float)) or value <= 0:
                raise KernelproConfigError(
                    f"{where}: peak_flops[{key!r}]={value!r} must be a positive FLOP/s number"
                )
        # A private copy of plain floats, so a caller's later edit of its dict cannot change us.
        object.__setattr__(self, "peak_flops", {k: float(v) for k, v in self.peak_flops.items()})
        object.__setattr__(self, "aliases", tuple(self.aliases))

    def matches(self, device_name: str) -> bool:
        """Whether `device_name` (as torch reports it) is this spec's name or an alias."""
        wanted = normalize_device_name(device_name)
        return any(normalize_device_name(n) == wanted for n in (self.name, *self.aliases))


def normalize_device_name(name: str) -> str:
    """Lower-case, `-`/`_` as spaces, single spaces, a leading "nvidia " dropped."""
    text = re.sub(r"[-_\s]+", " ", name.strip().lower())
    return text.removeprefix("nvidia ").strip()


@functools.cache
def builtin_device_specs() -> tuple[DeviceSpec, ...]:
    """The built-in GPU table (datasheet numbers, dense tensor rates: `device_table.py`, read
    on the first call)."""
    from pytest_kernelpro.measure.device_table import BUILTIN

    return tuple(DeviceSpec(**row) for row in BUILTIN)


def find_device_spec(device_name: str, extra: Iterable[DeviceSpec] = ()) -> DeviceSpec | None:
    """The spec whose name or alias equals `device_name` (normalised), or None.

    `extra` (specs a team adds through the `pytest_kernelpro_device_specs` hook) is searched
    first, so a team's entry overrides a built-in one of the same name.
    """
    for spec in (*tuple(extra), *builtin_device_specs()):
        if spec.matches(device_name):
            return spec
    return None
