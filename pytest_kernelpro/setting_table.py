"""The settings table: every persistent kernelpro setting (flag, ini key, `KERNELPRO_*`
environment variable, default, parser) and the value parsers it uses.

`config.py` registers these as options and resolves them once per session; `run/context.py`
resolves the marker-overridable ones per item; `run/isolate.py` hands them to an isolated
child. Kept apart from the resolution so the table reads as data.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

GROUP_NAME = "kernelpro"
GROUP_DESCRIPTION = "GPU kernel checking, timing, roofline and regression gate"

DEVICE_CHOICES = ("auto", "cuda", "cpu")
CPU_FLUSH_CHOICES = ("auto", "on", "off")
CLOCK_ANCHOR_CHOICES = ("off", "on")
CROSS_CPU_CHOICES = ("info", "gate")
SORT_CHOICES = ("status", "name", "median", "roofline", "change")
AUTOTUNE_MISMATCH_CHOICES = ("pin", "warn", "fail")  # gate/confirmation.py
CONFIRM_PROCESS_CHOICES = ("fresh", "same")


def parse_fraction(text: str) -> float:
    """A fraction in (0, 1], also written as a percentage ("5%")."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a fraction; write e.g. 0.05 or 5%"
        ) from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is outside (0, 1]; write e.g. 0.05 or 5%")
    return value


def parse_positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; write e.g. 2 or 0.5") from None
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def parse_positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; write e.g. 3") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def parse_device(text: str) -> str:
    value = str(text).strip().lower()
    if value in DEVICE_CHOICES or value.startswith("cuda:"):
        return value
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a device; use one of auto, cuda, cuda:N, cpu"
    )


def choice_parser(name: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = str(text).strip().lower()
        if value in choices:
            return value
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid {name}; use one of {', '.join(choices)}"
        )

    parse.__name__ = f"parse_{name.replace(' ', '_').replace('-', '_').lower()}"
    return parse


parse_cpu_flush = choice_parser("CPU flush mode", CPU_FLUSH_CHOICES)
parse_clock_anchor = choice_parser("clock anchor mode", CLOCK_ANCHOR_CHOICES)
parse_cross_cpu = choice_parser("cross-CPU mode", CROSS_CPU_CHOICES)
parse_sort = choice_parser("sort order", SORT_CHOICES)
parse_autotune_mismatch = choice_parser("autotune mismatch action", AUTOTUNE_MISMATCH_CHOICES)
parse_confirm_process = choice_parser("confirmation process", CONFIRM_PROCESS_CHOICES)


def parse_threads(text: str) -> int:
    """`auto` (0: the thread policy decides) or a positive thread count."""
    if str(text).strip().lower() == "auto":
        return 0
    return parse_positive_int(text)


def parse_history(text: str) -> str:
    """A directory for the run history, or `off`."""
    value = str(text).strip()
    return "" if value.lower() in ("off", "none", "false", "0", "") else value


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean; use true or false")


@dataclass(frozen=True)
class Setting:
    """One persistent setting: a CLI flag, an ini key and an environment variable."""

    name: str  # ini key without prefix, e.g. "threshold"
    help: str
    parse: Callable[[str], Any]
    default: Any
    metavar: str | None = None
    is_flag: bool = False
    # The names made from `name`, fixed when the setting is made: every resolution reads them.
    flag: str = field(init=False)  # --kernelpro-time-budget
    ini_key: str = field(init=False)  # kernelpro_time_budget
    env_var: str = field(init=False)  # KERNELPRO_TIME_BUDGET
    dest: str = field(init=False)  # kernelpro_time_budget (the option's attribute)

    def __post_init__(self) -> None:
        names = {
            "flag": "--kernelpro-" + self.name.replace("_", "-"),
            "ini_key": "kernelpro_" + self.name,
            "env_var": "KERNELPRO_" + self.name.upper(),
            "dest": "kernelpro_" + self.name,
        }
        for attribute, value in names.items():
            object.__setattr__(self, attribute, value)  # frozen: set once, here


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "device",
        "Device that runs PyTorch kernels: auto, cuda, cuda:N or cpu",
        parse_device,
        "auto",
        "DEVICE",
    ),
    Setting(
        "time_budget",
        "Timing budget per kernel in seconds (timing stops earlier once the median is stable; "
        "on the CPU it covers warm-up too). Default when unset: 2 on a GPU, 1 on the CPU",
        parse_positive_float,
        None,
        "SECONDS",
    ),
    Setting(
        "cpu_flush",
        "CPU cache flush before each sample: auto (only when the inputs fit in the "
        "last-level cache), on or off",
        parse_cpu_flush,
        "auto",
        "MODE",
    ),
    Setting(
        "cpu_threads",
        "torch threads for timing CPU kernels: auto (one thread: steady when other work "
        "shares the machine) or a number",
        parse_threads,
        0,
        "N",
    ),
    Setting(
        "cpu_cross_device",
        "A baseline from another CPU: info (reported, never fails) or gate (compared by "
        "efficiency and failed like a GPU's)",
        parse_cross_cpu,
        "info",
        "MODE",
    ),
    Setting(
        "allow_incomparable",
        "Pass a --kernelpro-check in which every kernel with a baseline entry is incomparable "
        "or unresolved (it checked nothing; by default that fails the session)",
        parse_bool,
        False,
        is_flag=True,
    ),
    Setting(
        "sort",
        "Order of the terminal table: status (attention first), name, median, roofline, change",
        parse_sort,
        "status",
        "KEY",
    ),
    Setting(
        "history",
        "Directory that keeps one JSON report per run (keyed by commit and machine), or off",
        parse_history,
        ".kernelpro/history",
        "DIR",
    ),
    Setting(
        "correctness_only",
        "Check correctness only: no timing, roofline, gate or profile",
        parse_bool,
        False,
        is_flag=True,
    ),
    Setting(
        "target_rel_ci",
        "Stop sampling when the median's 95% CI half-width is below this fraction of it",
        parse_fraction,
        0.005,
        "FRACTION",
    ),
    Setting(
        "warmup_ms", "Warm-up time per kernel in milliseconds", parse_positive_float, 300.0, "MS"
    ),
    Setting(
        "trials",
        "Correctness trials per kernel, each with fresh random inputs",
        parse_positive_int,
        3,
        "N",
    ),
    Setting(
        "threshold",
        "Regression threshold, relative to the baseline (marker threshold= wins); unset: "
        "2% for kernels timed on a CUDA GPU, 5% on the CPU, where the anchored comparison "
        "allows at least 25% (35% on a busy machine; gate/verdict_basis.py)",
        parse_fraction,
        None,
        "FRACTION",
    ),
    Setting(
        "clock_anchor",
        "GPU kernels whose warm-up ran under a clock limit (the power cap): on (default) "
        "times every sample followed by the clock anchor, a fixed bf16 GEMM, and the gate "
        "compares kernel / anchor per pair at 0.75x the threshold where either side ran "
        "capped (a baseline without the pairs falls back to times, and says so); off times "
        "the kernel alone and gates such kernels on time, at 3x the threshold where the SM "
        "clock was held down. CPU kernels: on follows every sample with a fixed fp32 GEMM, "
        "both in on-CPU time, and the gate compares on-CPU time checked against it, at a "
        "tolerance that follows the machine's load (gate/verdict_basis.py)",
        parse_clock_anchor,
        "on",
        "MODE",
    ),
    Setting(
        "confirm_process",
        "Where a provisional regression is re-measured to confirm it: fresh (a new process: "
        "new autotune picks, allocator and library state, so a slowdown that belongs to one "
        "process does not confirm itself; costs the process start on top of the re-timing) "
        "or same (this process, as before)",
        parse_confirm_process,
        "fresh",
        "MODE",
    ),
    Setting(
        "autotune_mismatch",
        "What the gate does when a regressed kernel's autotuner picked another config than "
        "the baseline's and, re-measured in a fresh process with the baseline's config "
        "pinned, the kernel is not slower: pin (default: gate at the baseline's pick, the "
        "kernel passes with a note), warn (reported as suspect, never failed) or fail (the "
        "head's pick is what users get: fail). A kernel still slower at the baseline's pick "
        "fails under every setting",
        parse_autotune_mismatch,
        "pin",
        "ACTION",
    ),
    Setting(
        "cuda_graph",
        "Time CUDA-graph replays instead of single launches (for launch-bound kernels)",
        parse_bool,
        False,
        is_flag=True,
    ),
    Setting(
        "require_gpu",
        "Fail every kernel that would be skipped or run on the CPU for want of a CUDA GPU "
        "(GPU CI runners; kernels marked device='cpu' are exempt)",
        parse_bool,
        False,
        is_flag=True,
    ),
    Setting(
        "problems", "Directory of KernelBench-format problem files to collect", str, None, "DIR"
    ),
    Setting(
        "baseline",
        "Baseline YAML that --kernelpro-check compares with",
        str,
        "kernelpro-baseline.yaml",
        "PATH",
    ),
    Setting(
        "json", "Where to write the JSON report", str, ".kernelpro/kernelpro-report.json", "PATH"
    ),
    Setting(
        "ceilings",
        "JSON file of device ceilings to use instead of measuring them",
        str,
        None,
        "PATH",
    ),
    Setting(
        "profile_timeout",
        "Time limit in seconds for one kernel's profiler run",
        parse_positive_float,
        120.0,
        "SECONDS",
    ),
    Setting(
        "item_timeout",
        "Time limit in seconds for one kernel item (check, timing, roofline, profile, gate); "
        "a kernel past it fails and the session goes on. A plugin whose own budget bounds "
        "the item (the optimizer's search) lifts the built-in default",
        parse_positive_float,
        300.0,
        "SECONDS",
    ),
    Setting(
        "isolate",
        "Run each kernel item in its own subprocess, so a crash (segfault, os._exit, an "
        "out-of-memory kill) fails only that item",
        parse_bool,
        False,
        is_flag=True,
    ),
    Setting(
        "auto_profiles",
        "Regressed kernels profiled automatically under --kernelpro-check (the rest say how "
        "to profile them)",
        parse_positive_int,
        3,
        "N",
    ),
    Setting(
        "auto_profile_time",
        "Seconds all automatic regression profiles of a session may take together",
        parse_positive_float,
        30.0,
        "SECONDS",
    ),
)
SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}
