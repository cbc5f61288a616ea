"""Impossible is an error: a time faster than the roofline allows fails the item.

`peak_paths.price_measured` already knows when a kernel's measured rate is beyond every
ceiling of the device by more than the ceilings' margin (`problem`: "flops", "bytes" or
both). Such a number is a bug report, not a result: work outside the timed stream, a result
cached between calls, or a wrong FLOP/byte count. `impossible_failure` turns it into the
item's failure, so it is never "improved" and never enters a baseline.

The rule is only as good as the ceilings: it applies only to trusted ones (`ceilings_trust`:
GPU ceilings, timed by device events; CPU ceilings only once best-of-probes and re-probed,
`Ceilings.trusted`; provisional ones never). The byte rule applies only when the inputs came
from memory (the cache flushed before every sample, or inputs larger than the cache): an
unflushed kernel whose inputs stay in cache honestly moves bytes faster than DRAM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def ceilings_trust(ceilings: Any) -> tuple[bool, str]:
    """(may the impossible-time rule use these ceilings, why)."""
    if ceilings is None:
        return False, "no ceilings"
    trusted = getattr(ceilings, "trusted", None)
    if isinstance(trusted, bool):  # measure/ceilings.py: best-of probes, re-probed if exceeded
        reason = getattr(ceilings, "trust_reason", "")
        text = str(reason() if callable(reason) else reason)
        return trusted, text or ("trusted" if trusted else "not trusted")
    details = getattr(ceilings, "details", {}) or {}
    if details.get("not_cached"):
        return False, f"not trusted: {details['not_cached']}"
    if getattr(ceilings, "device_type", "cpu") == "cuda":
        return True, "trusted: GPU ceilings (device-timed, or the datasheet's upper bound)"
    return False, "not trusted: CPU ceilings not confirmed by re-probing"


def inputs_from_memory(timing: Any) -> bool:
    """True when every sample read its inputs from memory: the cache was flushed, or the
    inputs exceed it (the CPU's `auto` flush decision says so)."""
    if timing is None:
        return False
    if getattr(timing, "flushed_l2", None):
        return True
    return "exceed" in str(getattr(timing, "flush_reason", "") or "")


def impossible_failure(
    peak_used: Mapping[str, Any] | None,
    *,
    ceilings: Any,
    median_s: float,
    timing: Any = None,
) -> str | None:
    """Why the kernel's time is impossible on these ceilings, or None (see the module
    docstring)."""
    if not peak_used or not peak_used.get("problem"):
        return None
    problems = set(str(peak_used["problem"]).split("+"))
    if not inputs_from_memory(timing):
        problems.discard("bytes")
    if not problems:
        return None
    trusted, trust = ceilings_trust(ceilings)
    if not trusted:
        return None
    what = " and ".join(sorted(problems))
    return (
        f"impossible time: its median {median_s * 1e6:.3g} us is faster than the roofline "
        f"allows ({what} beyond every ceiling by more than their margin: "
        f"{peak_used.get('note') or 'no detail'}; ceilings {trust}). This is not a result and "
        "is neither reported as improved nor saved in a baseline. Likely causes: device work "
        "outside the timed stream, a result cached between calls, or a wrong FLOP or byte "
        "count (pass flops= / bytes= in the marker if the count is wrong)"
    )
