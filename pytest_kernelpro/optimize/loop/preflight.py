"""Checks made before any kernel runs, so a requested search that cannot run stops the
session with a usage error instead of passing silently after minutes of work.

`served_model` (at configure, first): `--kernelpro-llm=openai` with a base URL and no model
set anywhere asks the server which models it serves and takes the only one; several, none,
or a listing that fails stop the session with the URL, the models or the failure, and the
setting to use. `check_backend` (at configure): Dask is installed when `--kernelpro-dask`
asks for it, the model backend can be built (an API key for anthropic; the SDK and a model
name for openai), the Anthropic API answers (one models request, no tokens spent), an
OpenAI-compatible server answers (`check_server_answers`: one models request), the
model has a price when the budget is in dollars, and a replay recording exists and holds
answers. `check_replay_items` (after collection): a replay directory holds a recording for
every kernel selected.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_kernelpro.optimize.loop.replay import recording_for, replay_source

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search_config import OptimizeConfig


class PreflightError(Exception):
    """Why the search cannot run; the plugin turns it into a `pytest.UsageError`."""


# Most model names a message lists; a hosted API serves dozens.
_LISTED_MODELS = 12
# How `served_model` names where the model came from: the server has just answered.
_SERVED_SOURCE = "the only model {url} serves"


@dataclass(frozen=True)
class ServedModel:
    """The model an OpenAI-compatible server serves alone, taken since none was set."""

    model: str
    source: str  # where the model came from, as `OptimizeConfig.sources` says it
    line: str  # said once in the session output


def _model_settings() -> str:
    from pytest_kernelpro.optimize.settings import SETTINGS_BY_NAME

    model = SETTINGS_BY_NAME["model"]
    return f"{model.flag}=NAME, ini key {model.ini_key} or environment variable {model.env_var}"


def _base_url(settings: OptimizeConfig) -> tuple[str | None, str]:
    """The OpenAI-compatible server's base URL and where it was set (None: not set)."""
    from pytest_kernelpro.optimize.agents.llm.openai_backend import BASE_URL_ENV

    if getattr(settings, "llm_base_url", None):
        return settings.llm_base_url, settings.sources.get("llm_base_url", "default")
    env = os.environ.get(BASE_URL_ENV) or None
    return env, f"environment variable {BASE_URL_ENV}"


def served_model(settings: OptimizeConfig) -> ServedModel | None:
    """The model to use when `--kernelpro-llm=openai` has a base URL and no model was set
    (command line, environment, ini, conftest): the one the server lists (`GET /models`).
    None when a model was set, the backend is not openai, or no base URL is known (then
    `check_backend` asks for a model). Raises `PreflightError` when the server lists several
    models or none, or when the listing fails."""
    if settings.llm != "openai" or settings.sources.get("model", "default") != "default":
        return None
    url, where = _base_url(settings)
    if url is None:
        return None
    from pytest_kernelpro.optimize.agents.llm.model_api import LLMError
    from pytest_kernelpro.optimize.agents.llm.openai_backend import served_models

    unset = f"no model is set for --kernelpro-llm=openai (set it with {_model_settings()})"
    try:
        models = served_models(url, timeout_s=20.0)
    except LLMError as exc:  # the SDK missing, or the listing failed (ModelListError)
        raise PreflightError(
            f"{unset}, and asking the server at {url} ({where}) which models it serves "
            f"failed: {exc}"
            + (
                "; or set the model, and the server is not asked"
                if getattr(exc, "answered", False)
                else ""
            )
        ) from None
    if len(models) == 1:
        return ServedModel(
            model=models[0],
            source=_SERVED_SOURCE.format(url=url),
            line=(
                f"kernelpro: optimizing with model {models[0]!r}, the only model the server "
                f"at {url} serves (no --kernelpro-model set)"
            ),
        )
    if not models:
        raise PreflightError(
            f"{unset}, and the server at {url} ({where}) lists no models at GET {url}/models; "
            "load a model into the server, or name the one it serves"
        )
    listed = ", ".join(repr(m) for m in models[:_LISTED_MODELS])
    more = len(models) - _LISTED_MODELS
    raise PreflightError(
        f"{unset}, and the server at {url} ({where}) serves {len(models)} models: {listed}"
        + (f" and {more} more" if more > 0 else "")
        + "; choose one"
    )


def check_backend(settings: OptimizeConfig, *, reach_api: bool = True) -> None:
    """Raise `PreflightError` when the search of this session cannot run (module doc)."""
    from pytest_kernelpro.optimize.agents.llm.model_api import LLMError, find_price
    from pytest_kernelpro.optimize.search.budget import parse_budget

    budget = parse_budget(settings.optimize or "", where="--kernelpro-optimize")
    if getattr(settings, "dask", None):  # --kernelpro-dask without Dask installed
        from pytest_kernelpro.errors import KernelproConfigError
        from pytest_kernelpro.optimize.dask.cluster import require_distributed

        try:
            require_distributed()
        except KernelproConfigError as exc:
            raise PreflightError(str(exc)) from None
    where = settings.sources.get("llm", "default")
    source = replay_source(settings.llm)
    if source is not None:
        if not source.exists():
            raise PreflightError(
                f"the replay recording {source} ({where}) does not exist; pass "
                "--kernelpro-llm=replay:PATH with a recording file or directory"
            )
        if source.is_file():
            _check_recording(source)
        elif not any(source.glob("*.jsonl")):
            raise PreflightError(
                f"the replay directory {source} ({where}) holds no <kernel>.jsonl recordings"
            )
        return
    if settings.llm not in ("anthropic", "openai"):
        raise PreflightError(
            f"unknown model backend {settings.llm!r} ({where}); use anthropic, openai or "
            "replay:PATH"
        )
    if budget.max_usd is not None and find_price(settings.model, settings.model_prices()) is None:
        raise PreflightError(
            f"the budget {settings.optimize!r} is in dollars but model {settings.model!r} "
            f"({settings.sources.get('model', 'default')}) has no known price, so its spend "
            "cannot be counted; give its price with --kernelpro-llm-price=IN,OUT (dollars per "
            "million tokens) or give an evaluation or time budget"
        )
    if settings.llm == "openai":
        from pytest_kernelpro.optimize.agents.llm.openai_backend import OpenAICompatibleBackend

        if settings.sources.get("model", "default") == "default":
            url, _ = _base_url(settings)
            raise PreflightError(
                f"--kernelpro-llm=openai ({where}) needs the name of the model the server "
                f"serves (the default, {settings.model!r}, is an Anthropic model): set it "
                f"with {_model_settings()}"
                + (
                    ""
                    if url
                    else ", or set --kernelpro-llm-base-url to your server's URL and its "
                    "model is asked for when it serves one"
                )
            )
        try:
            OpenAICompatibleBackend(
                model=settings.model,
                base_url=getattr(settings, "llm_base_url", None),
                timeout_s=20.0,
                max_retries=0,
            )
        except LLMError as exc:
            raise PreflightError(f"the optimizer cannot build its model backend: {exc}") from None
        if reach_api:
            check_server_answers(settings)
        return
    from pytest_kernelpro.optimize.agents.llm.anthropic_backend import AnthropicBackend

    try:
        backend = AnthropicBackend(
            model=settings.model,
            base_url=getattr(settings, "llm_base_url", None),
            timeout_s=20.0,
            max_retries=0,
        )
        if reach_api:
            backend.check_reachable()
    except LLMError as exc:
        raise PreflightError(f"the optimizer cannot reach its model: {exc}") from None


def check_server_answers(settings: OptimizeConfig) -> None:
    """`--kernelpro-llm=openai` with a model set: the server at the base URL answers (one
    `GET /models`, no tokens spent), or `PreflightError` says it does not and what to do.
    Without it a search against a server that is down ran every kernel and ended "no correct
    candidate" with exit 0. A server that answers with an HTTP error is up (not every one
    serves the model list); with no base URL known there is no server of ours to ask."""
    from pytest_kernelpro.optimize.agents.llm.model_api import LLMError
    from pytest_kernelpro.optimize.agents.llm.openai_backend import served_models

    url, where = _base_url(settings)
    if url is None or settings.sources.get("model") == _SERVED_SOURCE.format(url=url):
        return  # no server of ours, or it has just listed the model
    try:
        served_models(url, timeout_s=20.0)
    except LLMError as exc:
        if getattr(exc, "answered", True):
            return
        raise PreflightError(
            f"the model server at {url} ({where}) for model {settings.model!r} does not "
            f"answer: {exc}"
        ) from None


def _check_recording(path) -> None:  # type: ignore[no-untyped-def]
    from pytest_kernelpro.optimize.agents.llm.model_api import LLMError
    from pytest_kernelpro.optimize.loop.replay import NoiseTolerantReplay

    try:
        replay = NoiseTolerantReplay(path)
    except LLMError as exc:
        raise PreflightError(f"the replay recording cannot be used: {exc}") from None
    if not replay.purposes().get("programmer"):
        raise PreflightError(
            f"the replay recording {path} holds no programmer responses (only "
            f"{replay.purposes() or 'nothing'}), so no candidate can be replayed"
        )


def check_replay_items(settings: OptimizeConfig, kernels: Iterable[tuple[str, str]]) -> None:
    """Every selected kernel (item name, base name) has a recording in a replay directory."""
    source = replay_source(settings.llm)
    if source is None or not source.is_dir():
        return
    missing = [name for name, base in kernels if recording_for(source, name, base) is None]
    if missing:
        raise PreflightError(
            f"the replay directory {source} has no recording for {', '.join(sorted(missing))}; "
            "it needs <kernel>.jsonl for each kernel optimized (deselect the others with -k)"
        )
    for name, base in kernels:
        found = recording_for(source, name, base)
        if found is not None:
            _check_recording(found)


def preflight(settings: OptimizeConfig, *, checks: bool = True) -> tuple[OptimizeConfig, list[str]]:
    """A requested search that cannot run is a usage error before any work. Returns the
    settings with the model an OpenAI-compatible server serves alone when none was set
    (`served_model`), and the line that says so."""
    import dataclasses

    import pytest

    lines: list[str] = []
    try:
        served = served_model(settings)
        if served is not None:
            settings = dataclasses.replace(
                settings, model=served.model, sources={**settings.sources, "model": served.source}
            )
            lines.append(served.line)
        if checks:
            check_backend(settings)
    except PreflightError as exc:
        raise pytest.UsageError(f"kernelpro: --kernelpro-optimize cannot run: {exc}") from None
    return settings, lines
