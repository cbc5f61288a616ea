"""Settings: one option group, ini mirrors, `KERNELPRO_*` environment variables.

Precedence (highest first): marker keyword > command line > environment > ini > default.
Every persistent setting is a row of the table `SETTINGS` (flag, ini key, environment
variable, default, value parser); settings are parsed once, in `pytest_configure`, into the
frozen `KernelproConfig`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest


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
        "allows at least 25% (35% on a busy machine, 60% there for a kernel read against "
        "the memory anchor; gate/verdict_basis.py)",
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


def _help(setting: Setting) -> str:
    text = f"{setting.help}. Default: {setting.default!r} (ini {setting.ini_key}, env {setting.env_var})"
    return text.replace("%", "%%")  # argparse formats help with %


def add_options(parser: pytest.Parser) -> None:
    """Register the `kernelpro` option group and its ini mirrors."""
    group = parser.getgroup(GROUP_NAME, GROUP_DESCRIPTION)
    group.addoption(
        "--kernelpro-check",
        action="store_true",
        default=False,
        help="Compare every kernel with its baseline and fail on regressions. Default: False",
    )
    group.addoption(
        "--kernelpro-save-baseline",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="Write this run's results as the baseline (PATH or the baseline setting). Default: None",
    )
    group.addoption(
        "--kernelpro-profile",
        action="store_true",
        default=False,
        help="Profile every kernel (ncu metrics, SASS, timeline) and run the tools. Default: False",
    )
    group.addoption(
        "--kernelpro-only",
        action="store_true",
        default=False,
        help="Run only kernel items; deselect ordinary tests. Default: False",
    )
    group.addoption(
        "--kernelpro-isolated-child",
        action="store_true",
        default=False,
        help=argparse.SUPPRESS,  # set by --kernelpro-isolate on the process of one item
    )
    group.addoption(
        "--kernelpro-remeasure-child",
        default=None,
        metavar="PINS_JSON",
        # Set on the fresh process that re-measures a provisional regression
        # (run/fresh_process.py): time the item only, with these autotune choices pinned.
        help=argparse.SUPPRESS,
    )
    add_setting_options(group, parser, SETTINGS)


def add_setting_options(
    section: pytest.OptionGroup, parser: pytest.Parser, settings: tuple[Setting, ...]
) -> None:
    """Each setting as a `--kernelpro-*` flag in `section` and a `kernelpro_*` ini key."""
    for setting in settings:
        if setting.is_flag:
            section.addoption(
                setting.flag,
                action="store_const",
                const=True,
                default=None,
                dest=setting.dest,
                help=_help(setting),
            )
        else:
            section.addoption(
                setting.flag,
                default=None,
                dest=setting.dest,
                metavar=setting.metavar,
                type=setting.parse,
                help=_help(setting),
            )
        parser.addini(setting.ini_key, _help(setting), type="string", default=None)


def known_plugin_settings(config: pytest.Config) -> list[str]:
    """The names of the settings other plugins declare (`pytest_kernelpro_setting_names`)."""
    return [n for names in config.hook.pytest_kernelpro_setting_names() for n in names or ()]


def conftest_defaults(config: pytest.Config) -> dict[str, Any]:
    """What the project's `pytest_kernelpro_defaults` hooks return, merged (the first
    registered ranks lowest)."""
    defaults: dict[str, Any] = {}
    for contributed in reversed(config.hook.pytest_kernelpro_defaults(config=config)):
        defaults.update(contributed or {})  # pluggy calls the last registered first
    return defaults


def resolve_setting(
    config: pytest.Config,
    setting: Setting,
    environ: dict[str, str] | None = None,
    defaults: dict[str, Any] | None = None,
) -> tuple[Any, str]:
    """The value of one setting and where it came from (CLI > env > ini > conftest > default)."""
    import pytest

    env = os.environ if environ is None else environ
    cli_value = config.getoption(setting.dest, default=None)
    if cli_value is not None:
        return cli_value, f"command line {setting.flag}"
    ini_raw = config.getini(setting.ini_key)
    candidates = (
        (env.get(setting.env_var), f"environment variable {setting.env_var}"),
        (ini_raw if ini_raw not in (None, "") else None, f"ini key {setting.ini_key}"),
        ((defaults or {}).get(setting.name), "conftest pytest_kernelpro_defaults"),
    )
    for raw, where in candidates:
        if raw is None:
            continue
        try:
            return setting.parse(str(raw)), where
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"kernelpro: invalid value from {where}: {exc}") from None
    return setting.default, "default"


@dataclass(frozen=True)
class KernelproConfig:
    """All session-wide settings, parsed once."""

    rootpath: Path
    check: bool
    save_baseline: str | None  # path, or None when not saving
    profile: bool
    device: str
    time_budget_s: float | None  # None: 2 s on a GPU, 1 s on the CPU (budget_for)
    target_rel_ci: float
    warmup_ms: float
    trials: int
    threshold: float | None  # None: the per-device default (gate.verdict.default_threshold)
    cuda_graph: bool
    require_gpu: bool
    problems: Path | None
    baseline_path: Path
    json_path: Path
    ceilings_path: Path | None
    profile_timeout_s: float
    item_timeout_s: float | None  # None: no limit
    isolate: bool
    isolated_child: bool  # this process runs one item for a --kernelpro-isolate parent
    auto_profiles: int
    auto_profile_time_s: float
    sources: dict[str, str]  # setting name -> where its value came from
    cpu_flush: str = "auto"
    clock_anchor: str = "on"  # GPU: "on" pairs a capped kernel's samples with the clock anchor
    cpu_threads: int = 0  # 0: auto (measure.timing.cpu_load.policy_threads)
    cpu_cross_device: str = "info"
    allow_incomparable: bool = False  # a check that checked nothing passes
    sort: str = "status"
    history_dir: Path | None = None
    correctness_only: bool = False
    confirm_process: str = "fresh"  # where a provisional regression is re-measured
    autotune_mismatch: str = "pin"  # gate/confirmation.py
    # Set in the fresh process of a confirmation: the autotune choices to pin (a JSON file).
    remeasure_pins: Path | None = None
    # What the project's `pytest_kernelpro_defaults` hooks returned, merged once: other
    # plugins resolve their own settings from these, never by calling the hooks again.
    conftest_defaults: Mapping[str, Any] = field(default_factory=dict)
    # Every setting of `SETTINGS` as resolved, by name: what an isolated child is handed.
    resolved: Mapping[str, Any] = field(default_factory=dict)

    def budget_for(self, device: str) -> float:
        """The timing budget on `device`: the setting, else 2 s on a GPU and 1 s on the CPU
        (pytest-benchmark's max_time; CPU timings stop at the budget far more often)."""
        if self.time_budget_s is not None:
            return self.time_budget_s
        return 2.0 if device.startswith("cuda") else 1.0

    @property
    def artifacts_dir(self) -> Path:
        return self.rootpath / ".kernelpro"

    @property
    def records_path(self) -> Path:
        """The JSONL file each finished record is appended to, next to the JSON report."""
        return self.json_path.with_suffix(".jsonl")

    @classmethod
    def from_pytest_config(
        cls, config: pytest.Config, environ: dict[str, str] | None = None
    ) -> KernelproConfig:
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        defaults = conftest_defaults(config)
        # Names another plugin (the optimizer) resolves itself are known too.
        known = [*SETTINGS_BY_NAME, *known_plugin_settings(config)]
        unknown = sorted(set(defaults) - set(known))
        if unknown:
            import pytest

            raise pytest.UsageError(
                f"kernelpro: pytest_kernelpro_defaults returned unknown setting(s) "
                f"{', '.join(unknown)}; valid names: {', '.join(known)}"
            )
        for setting in SETTINGS:
            values[setting.name], sources[setting.name] = resolve_setting(
                config, setting, environ, defaults
            )
        root = Path(config.rootpath)

        def rooted(value: str | None) -> Path | None:
            if value is None:
                return None
            path = Path(value).expanduser()
            return path if path.is_absolute() else root / path

        baseline_path = rooted(values["baseline"])
        save = config.getoption("kernelpro_save_baseline", default=None)
        save_path = None if save is None else str(rooted(save) if save else baseline_path)
        return cls(
            **{name: values[name] for name in AS_RESOLVED},
            rootpath=root,
            check=bool(config.getoption("kernelpro_check", default=False)),
            save_baseline=save_path,
            profile=bool(config.getoption("kernelpro_profile", default=False)),
            time_budget_s=values["time_budget"],
            problems=rooted(values["problems"]),
            baseline_path=baseline_path or root / "kernelpro-baseline.yaml",
            json_path=rooted(values["json"]) or root / ".kernelpro/kernelpro-report.json",
            ceilings_path=rooted(values["ceilings"]),
            profile_timeout_s=values["profile_timeout"],
            item_timeout_s=values["item_timeout"],
            isolated_child=bool(config.getoption("kernelpro_isolated_child", default=False)),
            auto_profile_time_s=values["auto_profile_time"],
            sources=sources,
            history_dir=rooted(values["history"] or None),
            remeasure_pins=rooted(config.getoption("kernelpro_remeasure_child", default=None)),
            conftest_defaults=defaults,
            resolved=values,
        )


# The settings a `KernelproConfig` field of their own name holds as resolved (every flag's
# value is a bool already: `parse_bool`, or the flag's constant); the others are named for
# their unit (`time_budget_s`) or are paths rooted at the rootdir (`problems`, `json_path`).
AS_RESOLVED = tuple(
    f.name for f in fields(KernelproConfig) if f.name in SETTINGS_BY_NAME and f.name != "problems"
)
