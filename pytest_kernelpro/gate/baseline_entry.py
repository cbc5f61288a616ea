"""One kernel's baseline entry: what the gate keeps of a measurement, and its parsing.

The file around the entries (layout, atomic writes, locking, validation of the whole file) is
`baseline.py`; this module is the entry alone, so the gate's comparison (`verdict.py`) and the
file handling share one definition of what a kernel's measurement keeps.

Why up to 200 samples: the regression test (`verdict.py`) is Mann-Whitney U at alpha 0.01.
With 200 samples on each side it detects a shift of about 0.4 standard deviations with 95%
power (z_0.99 + z_0.95 = 3.97; 3.97 * sqrt(2/200) ~ 0.40). Kernel timings have a relative
spread of 0.5-3%, so 0.4 sigma is well under the smallest threshold anyone gates on (2-5%):
more samples would not change a verdict, only make the file bigger (200 values are ~3 KB per
kernel). The kept values are the sample's quantiles (`stats.quantile_subsample`), so the
median and the tails are preserved; `median_s`, `q1_s`, `q3_s` and `n` come from all samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pytest_kernelpro.gate.clock_scale import record_clock_facts
from pytest_kernelpro.gate.cpu_anchor import record_cpu_anchor
from pytest_kernelpro.gate.format import finite_float
from pytest_kernelpro.gate.stats import quantile_subsample
from pytest_kernelpro.record import KernelRecord

BASELINE_SAMPLES = 200


def anchor_of_timing(anchor: Any) -> tuple[str, float, list[float]] | None:
    """(name, anchor median, ratios) of a timing's anchored samples, or None without them."""
    if not isinstance(anchor, dict):
        return None
    name, median = anchor.get("name"), anchor.get("anchor_median_s")
    ratios = [float(v) for v in anchor.get("ratios") or () if _finite_pos(v)]
    if not isinstance(name, str) or not name or not _finite_pos(median) or not ratios:
        return None
    return name, float(median), ratios


@dataclass
class BaselineEntry:
    """What the gate keeps of one kernel's measurement."""

    name: str
    median_s: float
    samples_s: list[float]
    device: str = ""
    kernel: str = ""
    q1_s: float | None = None
    q3_s: float | None = None
    n: int = 0
    efficiency: float | None = None
    roofline_time_s: float | None = None
    method: str | None = None
    # The clock the samples ran at (gate/clock_scale.py); absent for CPU timings.
    sm_mhz: float | None = None  # mean SM clock over the NVML readings during the samples
    max_sm_mhz: float | None = None  # the GPU's maximum SM clock
    clock_capped_share: float | None = None  # share of samples under a power/thermal limit
    bound: str | None = None  # the reference's roofline bound
    # The anchored samples of a capped measurement (measure/timing/anchor.py): the
    # anchor's identity, its median, and kernel / anchor per pair (gate/clock_anchor.py).
    anchor: str | None = None
    anchor_median_s: float | None = None
    anchor_ratios: list[float] | None = None
    # What the kernel's autotuners chose in the baseline's process (measure/environment.py:
    # kernel, key, flat config, ...), the library settings that choose algorithms, and the
    # versions that change generated code (measure/environment.py). Absent in older files.
    autotune: list[dict[str, Any]] | None = None
    library: dict[str, Any] | None = None
    environment: dict[str, str] | None = None
    # A CPU timing's pairs with the CPU anchor (measure/timing/cpu.py,
    # gate/cpu_anchor.py): the kernel's and the anchor's on-CPU times, and why the machine
    # counted as busy.
    cpu_kernel_s: list[float] | None = None
    cpu_anchor_s: list[float] | None = None
    cpu_busy: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, in a stable key order, for YAML (clock and anchor keys only when
        known, so a baseline without them reads as before)."""
        clock = {
            key: value
            for key, value in (
                ("sm_mhz", _sig(self.sm_mhz)),
                ("max_sm_mhz", _sig(self.max_sm_mhz)),
                ("clock_capped_share", _sig(self.clock_capped_share)),
                ("bound", self.bound),
            )
            if value is not None
        }
        if self.anchor and self.anchor_ratios:
            clock.update(
                anchor=self.anchor,
                anchor_median_s=_sig(self.anchor_median_s),
                anchor_ratios=[_sig(v) for v in self.anchor_ratios],
            )
        process = {
            key: value
            for key, value in (
                ("autotune", self.autotune),
                ("library", self.library),
                ("environment", self.environment),
            )
            if value is not None
        }
        if self.cpu_kernel_s and self.cpu_anchor_s:
            clock.update(
                cpu_kernel_s=[_sig(v) for v in self.cpu_kernel_s],
                cpu_anchor_s=[_sig(v) for v in self.cpu_anchor_s],
            )
            if self.cpu_busy:
                clock["cpu_busy"] = self.cpu_busy
        return {
            "name": self.name,
            "kernel": self.kernel,
            "device": self.device,
            "median_s": _sig(self.median_s),
            "q1_s": _sig(self.q1_s),
            "q3_s": _sig(self.q3_s),
            "n": int(self.n),
            "efficiency": _sig(self.efficiency),
            "roofline_time_s": _sig(self.roofline_time_s),
            "method": self.method,
            **clock,
            **process,
            "samples_s": [_sig(v) for v in self.samples_s],
        }

    @classmethod
    def from_record(cls, record: KernelRecord) -> BaselineEntry | None:
        """The entry for a measured record; None when the record has no timing samples."""
        timing, stats = record.timing, record.timing.stats if record.timing else None
        if timing is None or stats is None:
            return None
        samples = [float(v) for v in timing.samples_s or () if _finite_pos(v)]
        med = stats.median_s
        if not samples or med is None or not _finite_pos(med):
            return None
        clock = record_clock_facts(record)
        anchor = anchor_of_timing(timing.anchor)
        cpu = record_cpu_anchor(record)
        return cls(
            name=record.name,
            kernel=record.kernel,
            device=record.device,
            median_s=float(med),
            q1_s=finite_float(stats.q1_s),
            q3_s=finite_float(stats.q3_s),
            n=int(stats.n or len(samples)),
            efficiency=finite_float(record.efficiency),
            roofline_time_s=finite_float(record.roofline_time_s),
            method=timing.method,
            samples_s=quantile_subsample(samples, BASELINE_SAMPLES),
            sm_mhz=clock.sm_mhz,
            max_sm_mhz=clock.max_sm_mhz,
            clock_capped_share=clock.capped_share,
            bound=clock.bound,
            anchor=None if anchor is None else anchor[0],
            anchor_median_s=None if anchor is None else anchor[1],
            anchor_ratios=None
            if anchor is None
            else quantile_subsample(anchor[2], BASELINE_SAMPLES),
            autotune=None if record.autotune is None else list(record.autotune.choices),
            library=None if record.autotune is None else record.autotune.library,
            environment=None if record.environment is None else record.environment.to_dict(),
            cpu_kernel_s=None
            if cpu is None
            else quantile_subsample(cpu.kernel_s, BASELINE_SAMPLES),
            cpu_anchor_s=None
            if cpu is None
            else quantile_subsample(cpu.anchor_s, BASELINE_SAMPLES),
            cpu_busy=None if cpu is None else cpu.busy,
        )


def parse_entry(raw: Any) -> BaselineEntry:
    """One kernel's entry of a baseline file; ValueError names what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError(f"the entry is a {type(raw).__name__}, expected a mapping")
    median = raw.get("median_s")
    if not _finite_pos(median):
        raise ValueError(f"median_s is {median!r}, expected a positive number of seconds")
    samples = raw.get("samples_s")
    if not isinstance(samples, list) or not samples:
        raise ValueError(f"samples_s is {_short(samples)}, expected a non-empty list of seconds")
    bad = [v for v in samples if not _finite_pos(v)]
    if bad:
        raise ValueError(f"samples_s holds {_short(bad[0])}, expected positive numbers")
    out = BaselineEntry(
        name=_opt_str(raw, "name") or "",
        kernel=_opt_str(raw, "kernel") or "",
        device=_opt_str(raw, "device") or "",
        median_s=float(median),
        samples_s=[float(v) for v in samples],
        method=_opt_str(raw, "method"),
    )
    for key in ("q1_s", "q3_s", "efficiency", "roofline_time_s"):
        value = raw.get(key)
        if value is not None and not _finite_nonneg(value):
            raise ValueError(f"{key} is {_short(value)}, expected a number or null")
        setattr(out, key, None if value is None else float(value))
    for key in ("sm_mhz", "max_sm_mhz", "clock_capped_share"):
        value = raw.get(key)
        if value is not None and not _finite_nonneg(value):
            raise ValueError(f"{key} is {_short(value)}, expected a number or null")
        setattr(out, key, None if value is None else float(value))
    out.bound = _opt_str(raw, "bound")
    out.anchor = _opt_str(raw, "anchor")
    value = raw.get("anchor_median_s")
    if value is not None and not _finite_pos(value):
        raise ValueError(f"anchor_median_s is {_short(value)}, expected a positive number or null")
    out.anchor_median_s = None if value is None else float(value)
    ratios = raw.get("anchor_ratios")
    if ratios is not None:
        if not isinstance(ratios, list) or not ratios or not all(_finite_pos(v) for v in ratios):
            raise ValueError(
                f"anchor_ratios is {_short(ratios)}, expected a non-empty list of positive numbers"
            )
        out.anchor_ratios = [float(v) for v in ratios]
    out.autotune, out.library, out.environment = _process_facts(raw)
    for key in ("cpu_kernel_s", "cpu_anchor_s"):
        values = raw.get(key)
        if values is not None:
            if (
                not isinstance(values, list)
                or not values
                or not all(_finite_pos(v) for v in values)
            ):
                raise ValueError(
                    f"{key} is {_short(values)}, expected a non-empty list of positive seconds"
                )
            setattr(out, key, [float(v) for v in values])
    out.cpu_busy = _opt_str(raw, "cpu_busy")
    n = raw.get("n", len(samples))
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n is {_short(n)}, expected a positive integer")
    out.n = n
    return out


def _process_facts(
    raw: dict[str, Any],
) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None, dict[str, str] | None]:
    """The entry's autotune choices, library settings and versions, each checked for its
    shape (a hand-edited or merged file must fail here, not in the comparison)."""
    choices = raw.get("autotune")
    if choices is not None:
        if not isinstance(choices, list) or not all(
            isinstance(c, dict)
            and isinstance(c.get("kernel"), str)
            and isinstance(c.get("config"), dict)
            for c in choices
        ):
            raise ValueError(
                f"autotune is {_short(choices)}, expected a list of mappings with a kernel "
                "name and a config"
            )
        for choice in choices:
            if choice.get("key") is not None and not isinstance(choice["key"], list):
                raise ValueError(
                    f"autotune key of {choice['kernel']} is {_short(choice['key'])}, "
                    "expected a list or null"
                )
    library = raw.get("library")
    if library is not None and not isinstance(library, dict):
        raise ValueError(f"library is {_short(library)}, expected a mapping")
    environment = raw.get("environment")
    if environment is not None:
        if not isinstance(environment, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in environment.items()
        ):
            raise ValueError(
                f"environment is {_short(environment)}, expected a mapping of names to "
                "version strings"
            )
    return choices, library, environment


def _opt_str(raw: dict[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key} is {_short(value)}, expected a string")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite_pos(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value) and value > 0


def _finite_nonneg(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value) and value >= 0


def _sig(value: float | None, digits: int = 6) -> float | None:
    """Six significant digits: below timer resolution (CUDA events ~0.5 us), a third the size."""
    if value is None:
        return None
    return float(f"{float(value):.{digits}g}")
