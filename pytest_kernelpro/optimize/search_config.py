"""The optimizer's settings resolved once, with the project's precedence (command line >
environment > ini > conftest defaults > built-in), under `--kernelpro-optimize` only.

Their flags, ini keys and `KERNELPRO_*` variables are the table of `settings.py`, which every
session registers; this resolution loads only with the flag. They extend the gate's settings: `OptimizeConfig` is the gate's `KernelproConfig` plus the search's own
values, so the search reads one object, and the gate's item runner reads the same one when the
optimizer plugin installs it on the session.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.config import KernelproConfig, resolve_setting
from pytest_kernelpro.optimize.settings import SETTINGS

if TYPE_CHECKING:
    import pytest


@dataclass(frozen=True)
class OptimizeConfig(KernelproConfig):
    """The gate's settings and the search's own, parsed once."""

    optimize: str | None = None  # the budget text; None: no search this session
    resume: bool = False  # continue the latest search of each kernel
    feedback: str = "tools"
    orchestration: str = "proactive"
    search: str = "mcts"
    llm_base_url: str | None = None
    dask: str | None = None  # local, local:N or a scheduler address
    llm: str = "anthropic"
    model: str = "claude-sonnet-5-5"
    llm_price: tuple[float, float] | None = None  # dollars per million tokens in, out

    def model_prices(self) -> dict[str, tuple[float, float]]:
        """The price the user gave for the model (`--kernelpro-llm-price`), as the backends'
        `prices` table: it comes before the built-in one."""
        return {} if self.llm_price is None else {self.model: self.llm_price}

    candidates: int = 2
    max_tokens: int = 8192
    # `kernelpro_sandbox_data`: the data files a candidate may read, as pytest parsed the ini.
    sandbox_data: tuple[str, ...] = ()

    @classmethod
    def extend(
        cls,
        gate: KernelproConfig,
        config: pytest.Config,
        environ: dict[str, str] | None = None,
    ) -> OptimizeConfig:
        """The gate's resolved settings plus the search's. A search's own budget bounds an
        item, so the gate's built-in item time limit is lifted under `--kernelpro-optimize`
        (a limit set anywhere else stays)."""
        values: dict[str, Any] = {}
        sources = dict(gate.sources)
        for setting in SETTINGS:
            values[setting.name], sources[setting.name] = resolve_setting(
                config, setting, environ, dict(gate.conftest_defaults)
            )
        budget = config.getoption("kernelpro_optimize", default=None)
        base = {f.name: getattr(gate, f.name) for f in dataclasses.fields(KernelproConfig)}
        if budget and gate.sources.get("item_timeout") == "default":
            base["item_timeout_s"] = None
            sources["item_timeout"] = "lifted by --kernelpro-optimize (the budget bounds it)"
        base["sources"] = sources
        return cls(
            **base,
            **values,
            optimize=budget,
            resume=bool(config.getoption("kernelpro_resume", default=False)),
            sandbox_data=tuple(config.getini("kernelpro_sandbox_data")),
        )

    def child_args(self) -> list[str]:
        """These settings as flags, for the process of one item under --kernelpro-isolate."""
        if not self.optimize:
            return []
        args = [f"--kernelpro-optimize={self.optimize}"]
        if self.resume:
            args.append("--kernelpro-resume")
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            if isinstance(value, tuple):  # a pair such as the model's price: IN,OUT
                value = ",".join(str(part) for part in value)
            if value is not None:
                args.append(f"{setting.flag}={value}")
        return args
