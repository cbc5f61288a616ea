"""Settings: one option group, ini mirrors, `KERNELPRO_*` environment variables.

Precedence (highest first): marker keyword > command line > environment > ini > default.
Settings are parsed once, in `pytest_configure`, into the frozen `KernelproConfig`. The
table of settings and their value parsers is `setting_table.py`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.setting_table import (
    GROUP_DESCRIPTION,
    GROUP_NAME,
    SETTINGS,
    SETTINGS_BY_NAME,
    Setting,
)

if TYPE_CHECKING:
    import pytest


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
    """Each setting as a `--kernelpro-*` flag in `section` and a `kernelpro_*` ini key (a
    plugin with settings of its own, the optimizer, registers them the same way)."""
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
    candidates = ((env.get(setting.env_var), f"environment variable {setting.env_var}"),)
    ini_raw = config.getini(setting.ini_key)
    candidates += ((ini_raw if ini_raw not in (None, "") else None, f"ini key {setting.ini_key}"),)
    for raw, where in candidates:
        if raw is None:
            continue
        try:
            return setting.parse(str(raw)), where
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"kernelpro: invalid value from {where}: {exc}") from None
    conftest_value = (defaults or {}).get(setting.name)
    if conftest_value is not None:
        where = "conftest pytest_kernelpro_defaults"
        try:
            return setting.parse(str(conftest_value)), where
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
    only: bool
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
    def cache_dir(self) -> Path:
        """The ceilings cache: per machine and user, outside the project
        (`measure.ceilings.default_cache_dir`; $KERNELPRO_CACHE_DIR moves it)."""
        from pytest_kernelpro.measure.ceilings import default_cache_dir

        return default_cache_dir()

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
            rootpath=root,
            check=bool(config.getoption("kernelpro_check", default=False)),
            save_baseline=save_path,
            profile=bool(config.getoption("kernelpro_profile", default=False)),
            only=bool(config.getoption("kernelpro_only", default=False)),
            device=values["device"],
            time_budget_s=values["time_budget"],
            target_rel_ci=values["target_rel_ci"],
            warmup_ms=values["warmup_ms"],
            trials=values["trials"],
            threshold=values["threshold"],
            cuda_graph=values["cuda_graph"],
            require_gpu=values["require_gpu"],
            problems=rooted(values["problems"]),
            baseline_path=baseline_path or root / "kernelpro-baseline.yaml",
            json_path=rooted(values["json"]) or root / ".kernelpro/kernelpro-report.json",
            ceilings_path=rooted(values["ceilings"]),
            profile_timeout_s=values["profile_timeout"],
            item_timeout_s=values["item_timeout"],
            isolate=bool(values["isolate"]),
            isolated_child=bool(config.getoption("kernelpro_isolated_child", default=False)),
            auto_profiles=values["auto_profiles"],
            auto_profile_time_s=values["auto_profile_time"],
            sources=sources,
            cpu_flush=values["cpu_flush"],
            clock_anchor=values["clock_anchor"],
            cpu_threads=values["cpu_threads"],
            cpu_cross_device=values["cpu_cross_device"],
            allow_incomparable=bool(values["allow_incomparable"]),
            sort=values["sort"],
            history_dir=rooted(values["history"] or None),
            correctness_only=bool(values["correctness_only"]),
            confirm_process=values["confirm_process"],
            autotune_mismatch=values["autotune_mismatch"],
            remeasure_pins=_remeasure_pins(config),
            conftest_defaults=defaults,
        )


def _remeasure_pins(config: pytest.Config) -> Path | None:
    value = config.getoption("kernelpro_remeasure_child", default=None)
    return None if value is None else Path(value)
