"""CPU ceilings that load cannot lower: the best of every probe, and a re-probe on exceedance.

A ceiling is an upper bound on what a kernel can reach: other work on the machine only ever
makes a probe slower, never faster. So whenever the CPU's ceilings are measured again for the
same machine, torch version and thread count, each one keeps the best of the old and the new
probe (`best_of`), and a kernel that ran faster than a ceiling allows (beyond the
`peak_paths.CEILING_MARGIN`) first has the ceilings re-probed (`reprobe`) before anything is
blamed: on the project's busy 2-core VM, honest kernels read 109-319% of rooflines whose
ceilings had been measured under load, and the message named their FLOP count.

`Ceilings.trusted` (ceilings.py) is True on the CPU only after such a re-probe; the rule that
fails an impossible time may use only trusted ceilings. `exceedance_note` says what a rate
above the ceilings is blamed on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_kernelpro.measure.ceilings import Ceilings, best_of


def reprobe(
    ceilings: Ceilings,
    device: str,
    cache_dir: Path,
    *,
    why: str,
    quick: bool = False,
    measure: Callable[..., Ceilings] | None = None,
) -> Ceilings:
    """Measure `device`'s ceilings again and keep the best of both (`best_of`), cached.

    `why` is recorded (the kernel that exceeded a ceiling, or `kernelpro calibrate`);
    `measure` replaces `ceilings.measure_ceilings` (tests). GPU ceilings are returned as
    they are: device-timed, no load lowers them.
    """
    import torch

    from pytest_kernelpro.fileio import atomic_write_json
    from pytest_kernelpro.measure import ceilings as ceilings_module

    if ceilings.device_type != "cpu":
        return ceilings
    measure = measure or ceilings_module.measure_ceilings
    fresh = measure(device, quick=quick)
    merged, rose = best_of(ceilings, fresh)
    history: list[dict[str, Any]] = list(ceilings.details.get("reprobe_history") or [])
    history.append(
        {
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "why": why,
            "rose": rose,
        }
    )
    merged = replace(merged, details={**merged.details, "reprobe_history": history[-10:]})
    threads = torch.get_num_threads()
    path = ceilings_module.cache_path(
        Path(cache_dir), merged.device, merged.torch_version, quick, threads
    )
    atomic_write_json(
        path,
        {"schema": ceilings_module.CACHE_SCHEMA, "quick": quick, "ceilings": merged.to_dict()},
    )
    return merged


def reprobe_summary(ceilings: Ceilings) -> str:
    """One line on the last re-probe: "re-probed (a kernel exceeded them): fp32 45 -> 143
    GFLOP/s" or "re-probed: no ceiling rose"."""
    history = ceilings.details.get("reprobe_history") or []
    if not history:
        return "not re-probed"
    last = history[-1]
    rose = last.get("rose") or []
    what = "; ".join(rose) if rose else "no ceiling rose"
    return f"re-probed ({last.get('why')}): {what}"


def exceedance_note(ceilings: Ceilings) -> str:
    """What a CPU rate above every ceiling is blamed on, after the re-probe (or without it)."""
    if ceilings.trusted:
        return (
            f"the ceilings were re-probed and still hold ({ceilings.trust_reason()}; "
            f"{reprobe_summary(ceilings)}), so load did not cause it"
        )
    return (
        f"the CPU ceilings are {ceilings.trust_reason().removeprefix('not trusted: ')} "
        "and could not be re-probed here: they may have been measured under load, which "
        "lowers them; run `kernelpro calibrate` on a quiet machine before suspecting the "
        "FLOP or byte count"
    )


def exceeds_every_ceiling(peak_used: Any) -> bool:
    """True when a record's pricing (`peak_paths.record_pricing`'s peak_used) found its rate
    above every ceiling."""
    return isinstance(peak_used, dict) and bool(peak_used.get("problem"))
