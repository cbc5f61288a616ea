"""What an item's autotuned kernels chose in this process (`AutotuneCapture`), and pinning the
baseline's choices. An item whose process has no autotuner loaded and no pins to apply never
imports this module (`run/context.autotune_capture`).

An autotuner picks a configuration per process by timing its candidates, and two processes
running the same code may pick differently (the timings it decides on are as noisy as any).
Triton's `Autotuner` (`triton.runtime.autotuner`, read for 3.6) keeps what it chose: `configs`
(the candidates), `keys` (the arguments whose values select a tuning: `autotune_key`), `cache`
(key tuple -> the chosen `Config`) and `best_config` (the last call's); a `Config` is recorded
flat, as its `all_kwargs()` gives it (`config_dict`: `{"BLOCK_SIZE": 1024, "num_warps": 8}`).

`AutotuneCapture.watching()` wraps `run` of every autotuner class (Triton's, and any a
conftest names through `pytest_kernelpro_autotuners`) while the item's correctness trials run:
the first calls are where a process tunes. Each call's key is computed the way Triton does;
the choice is read back from `cache` / `best_config` after the call, so a Triton whose key
rule changed still records the config (with the key it really used when it can be found).
The timing runs without the wrapper (it would add host time to every launch), and
`after_timing` records any key first tuned during the timing from the caches' growth.

Pinning (`pins`): before a call whose kernel and key have a pinned choice, the matching config
of the autotuner's own `configs` is put into `cache[key]`, so the autotuner runs it without
tuning, that call and every later one with the key (Triton checks its cache first). A pin
whose config is no longer among the kernel's `configs` is not applied and says why: the
configs changed, so the code did.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure.environment import autotuner_classes, json_value
from pytest_kernelpro.record import AutotunePart

TUNED = "tuned"  # benchmarked its configs in this process
CACHED = "cached"  # found in the autotuner's cache (tuned earlier in this process)
PINNED = "pinned"  # the pinned config, placed in the cache before the call
SINGLE = "single"  # only one config: nothing to choose
TUNED_IN_TIMING = "tuned during timing"  # a key first seen in the timing's calls


def kernel_name(tuner: Any) -> str:
    """The autotuned function's module and qualified name (Triton: `base_fn`)."""
    fn = getattr(tuner, "base_fn", None) or getattr(tuner, "fn", None)
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{module}.{name}"


def config_dict(config: Any) -> dict[str, Any]:
    """A Triton `Config` flat, as `all_kwargs()` gives it (meta-parameters, num_warps,
    num_stages, num_ctas, maxnreg when set), JSON values."""
    try:
        flat = config.all_kwargs()
    except Exception:  # another shape of config: its public attributes
        flat = dict(getattr(config, "kwargs", {}) or {})
        for name in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
            if getattr(config, name, None) is not None:
                flat[name] = getattr(config, name)
    return {str(k): json_value(v) for k, v in dict(flat).items()}


def autotune_key(tuner: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The key Triton 3.6's `Autotuner.run` computes for a call: the `keys` arguments' values,
    then `str(dtype)` of every argument (of the kernel's own, in call order) with a dtype."""
    names = list(getattr(tuner, "arg_names", ()) or ())
    all_args = {**dict(zip(names, args, strict=False)), **kwargs}
    own = {k: v for k, v in all_args.items() if k in names}
    key: list[Any] = [own[k] for k in getattr(tuner, "keys", ()) or () if k in own]
    key += [str(v.dtype) for v in own.values() if hasattr(v, "dtype")]
    return tuple(key)


def key_text(key: Sequence[Any] | None) -> list[Any] | None:
    """A key in its recorded (JSON) form."""
    return None if key is None else [json_value(v) for v in key]


@dataclass(frozen=True)
class Pin:
    """A choice to impose: this kernel, at this key (recorded form), runs this config."""

    kernel: str
    key: list[Any] | None
    config: dict[str, Any]

    @classmethod
    def from_choice(cls, choice: Mapping[str, Any]) -> Pin:
        key = choice.get("key")
        return cls(
            kernel=str(choice.get("kernel")),
            key=list(key) if isinstance(key, list) else None,
            config=dict(choice.get("config") or {}),
        )


def read_pins(path: Any) -> list[Pin]:
    """The pins file of a re-measuring child: a JSON list of recorded choices."""
    try:
        with open(path, encoding="utf-8") as file:  # closed at once: no handle left behind
            data = json.loads(file.read())
    except (OSError, ValueError) as exc:
        raise KernelproError(f"cannot read the autotune pins {path}: {exc}") from exc
    if not isinstance(data, list) or not all(isinstance(c, dict) for c in data):
        raise KernelproError(f"the autotune pins {path} are not a JSON list of choices")
    return [Pin.from_choice(c) for c in data]


@dataclass
class _Seen:
    """One autotuner met during the capture."""

    tuner: Any
    keys_after_check: set[Any] = field(default_factory=set)


class AutotuneCapture:
    """Records the choices of autotuned kernels (and applies `pins`) while `watching`."""

    def __init__(self, pins: Iterable[Pin] = (), classes: Iterable[type] = ()) -> None:
        self.pins = list(pins)
        self.extra_classes = list(classes)
        self.choices: dict[tuple[str, str], dict[str, Any]] = {}
        self.pin_problems: list[str] = []
        self._seen: dict[int, _Seen] = {}

    def _pin_for(self, tuner: Any, key: tuple[Any, ...]) -> tuple[Pin | None, Any]:
        """The pin for this call and the autotuner's own config matching it (or None)."""
        name, recorded = kernel_name(tuner), key_text(key)
        for pin in self.pins:
            if pin.kernel != name or (pin.key is not None and pin.key != recorded):
                continue
            for config in getattr(tuner, "configs", ()) or ():
                if config_dict(config) == pin.config:
                    return pin, config
            problem = (
                f"{name.rsplit('.', 1)[-1]}: the baseline's config {config_words(pin.config)} "
                "is not among the kernel's configs now (its configs changed), so it was not pinned"
            )
            if problem not in self.pin_problems:
                self.pin_problems.append(problem)
            return pin, None
        return None, None

    def _wrap(self, original: Any) -> Any:
        capture = self

        def run(tuner: Any, *args: Any, **kwargs: Any) -> Any:
            configs = getattr(tuner, "configs", ()) or ()
            cache = getattr(tuner, "cache", None)
            key: tuple[Any, ...] | None = None
            had: set[Any] = set()
            pinned = None
            if len(configs) > 1 and isinstance(cache, dict):
                key = autotune_key(tuner, args, kwargs)
                had = set(cache)
                pin, config = capture._pin_for(tuner, key) if capture.pins else (None, None)
                if config is not None:
                    cache[key] = config
                    pinned = config
            result = original(tuner, *args, **kwargs)
            capture._note(tuner, key, had, pinned)
            return result

        run.__wrapped__ = original  # type: ignore[attr-defined]
        return run

    def _note(self, tuner: Any, key: tuple[Any, ...] | None, had: set[Any], pinned: Any) -> None:
        seen = self._seen.setdefault(id(tuner), _Seen(tuner))
        config = getattr(tuner, "best_config", None)
        configs = getattr(tuner, "configs", ()) or ()
        cache = getattr(tuner, "cache", None)
        if config is None:
            return
        if len(configs) <= 1:
            source, used_key = SINGLE, None
        else:
            used_key = key
            if isinstance(cache, dict) and cache.get(key) is not config:
                # Triton computed another key than ours (its rule changed): the key it
                # added in this call with this config, if one.
                new = [k for k in cache if k not in had and cache[k] is config]
                used_key = new[0] if len(new) == 1 else None
            if pinned is not None and config is pinned:
                source = PINNED
            elif used_key is not None and used_key in had:
                source = CACHED
            else:
                source = TUNED
        self._add(tuner, used_key, config, source)
        if isinstance(cache, dict):
            seen.keys_after_check.update(cache)

    def _add(self, tuner: Any, key: Any, config: Any, source: str) -> None:
        name = kernel_name(tuner)
        recorded = key_text(key)
        ident = (name, repr(recorded))
        if ident in self.choices:
            return
        choice: dict[str, Any] = {
            "kernel": name,
            "key": recorded,
            "key_names": [str(k) for k in getattr(tuner, "keys", ()) or ()],
            "config": config_dict(config),
            "configs": len(getattr(tuner, "configs", ()) or ()),
            "source": source,
        }
        if getattr(tuner, "cache_results", False):
            # Triton's disk cache of tunings: a fresh process reads the earlier pick.
            choice["disk_cache"] = True
        self.choices[ident] = choice

    @contextlib.contextmanager
    def watching(self) -> Iterator[AutotuneCapture]:
        """Wrap the autotuner classes' `run` for the duration; restored on exit."""
        patched: list[tuple[type, Any]] = []
        try:
            for cls in autotuner_classes(self.extra_classes):
                original = cls.__dict__.get("run")
                if original is None:
                    continue
                cls.run = self._wrap(original)  # type: ignore[attr-defined]
                patched.append((cls, original))
            yield self
        finally:
            for cls, original in reversed(patched):
                cls.run = original  # type: ignore[attr-defined]

    def after_timing(self) -> None:
        """Record keys first tuned while the timing ran (without the wrapper): the growth of
        each seen autotuner's cache since the capture."""
        for seen in self._seen.values():
            cache = getattr(seen.tuner, "cache", None)
            if not isinstance(cache, dict):
                continue
            for key, config in list(cache.items()):
                if key not in seen.keys_after_check:
                    self._add(seen.tuner, key, config, TUNED_IN_TIMING)
            seen.keys_after_check.update(cache)

    def part(self, library: dict[str, Any] | None) -> AutotunePart:
        """The record's `autotune` part: the choices, the pins and why a pin could not be
        applied (None when none), and the `library` settings that choose algorithms."""
        pinned = tuple({"kernel": p.kernel, "key": p.key, "config": p.config} for p in self.pins)
        return AutotunePart(
            choices=tuple(self.choices.values()),
            library=library,
            pinned=pinned or None,
            pin_problems=tuple(self.pin_problems) or None,
        )


def config_words(config: Mapping[str, Any]) -> str:
    """A config in words: "BLOCK_SIZE=1024, num_warps=8, num_stages=3"."""
    return ", ".join(f"{k}={v}" for k, v in config.items()) or "(no parameters)"
