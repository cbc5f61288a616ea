"""A stand-in for Triton's autotuner on the CPU, written after `triton/runtime/autotuner.py`
of Triton 3.6: the same attribute names (`configs`, `keys`, `cache`, `best_config`,
`arg_names`, `fn`, `base_fn`, `nargs`, `cache_results`), the same key rule (the `keys`
arguments' values, then `str(dtype)` of every argument with a dtype), the same `run` (tune on
a key's first call by timing every config, keep the fastest in `cache`; one config: no
tuning) and the same `Config` (`kwargs`, `num_warps`, `num_stages`, `num_ctas`, `maxnreg`,
`all_kwargs()`, equality by `all_kwargs()`). The kernel is a Python function on tensors; it
receives the config's meta-parameters as keywords, as a Triton kernel receives constexprs.

Tests steer the pick with `do_bench` (the autotuner's timing of one config), as Triton's
`autotune(do_bench=...)` allows. Kept self-contained: pytester projects copy this file.
"""

from __future__ import annotations

import builtins
import inspect
import time
from typing import Any


class Config:
    def __init__(
        self,
        kwargs: dict[str, Any],
        num_warps: int = 4,
        num_stages: int = 3,
        num_ctas: int = 1,
        maxnreg: int | None = None,
        pre_hook: Any = None,
        ir_override: str | None = None,
    ) -> None:
        self.kwargs = kwargs
        self.num_warps = num_warps
        self.num_ctas = num_ctas
        self.num_stages = num_stages
        self.maxnreg = maxnreg
        self.pre_hook = pre_hook
        self.ir_override = ir_override

    def all_kwargs(self) -> dict[str, Any]:
        return {
            **self.kwargs,
            **{
                k: v
                for (k, v) in (
                    ("num_warps", self.num_warps),
                    ("num_ctas", self.num_ctas),
                    ("num_stages", self.num_stages),
                    ("maxnreg", self.maxnreg),
                    ("ir_override", self.ir_override),
                )
                if v is not None
            },
        }

    def __hash__(self) -> int:
        return hash((*self.all_kwargs().items(), self.pre_hook))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return (*self.all_kwargs().items(), self.pre_hook) == (
            *other.all_kwargs().items(),
            other.pre_hook,
        )

    def __str__(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in self.all_kwargs().items())


class JITFunction:
    """Triton's `@jit` stand-in: `run` calls the Python function with the arguments and the
    meta-parameters it declares; `kernel[grid](...)` launches."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.arg_names = list(inspect.signature(fn).parameters)

    def run(self, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> Any:
        accepted = {k: v for k, v in kwargs.items() if k in self.arg_names}
        return self.fn(*args, **accepted)

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)


def _perf_counter_bench(kernel_call: Any, quantiles: Any) -> list[float]:
    times = []
    for _ in range(5):
        start = time.perf_counter()
        kernel_call()
        times.append(time.perf_counter() - start)
    times.sort()
    return [times[len(times) // 2]] * 3


class Autotuner:
    def __init__(
        self,
        fn: JITFunction,
        arg_names: list[str],
        configs: list[Config],
        key: list[str],
        do_bench: Any = None,
        cache_results: bool = False,
    ) -> None:
        self.configs = configs or [Config({}, num_warps=4, num_stages=3, num_ctas=1)]
        self.keys = key
        self.cache: dict[tuple[Any, ...], Config] = {}
        self.arg_names = arg_names
        self.cache_results = cache_results
        self.fn = fn
        self.base_fn = fn
        while not inspect.isfunction(self.base_fn):
            self.base_fn = self.base_fn.fn
        self.do_bench = do_bench or _perf_counter_bench
        self.nargs: dict[str, Any] | None = None
        self.best_config: Config | None = None

    def _bench(self, *args: Any, config: Config, **meta: Any) -> list[float]:
        current = dict(meta, **config.all_kwargs())

        def kernel_call() -> None:
            self.fn.run(*args, **current)

        return self.do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8))

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        if len(self.configs) > 1:
            all_args = {**self.nargs, **kwargs}
            _args = {k: v for (k, v) in all_args.items() if k in self.arg_names}
            key = [_args[key] for key in self.keys if key in _args]
            for _, arg in _args.items():
                if hasattr(arg, "dtype"):
                    key.append(str(arg.dtype))
            key_tuple = tuple(key)
            if key_tuple not in self.cache:
                timings = {
                    config: self._bench(*args, config=config, **kwargs) for config in self.configs
                }
                self.cache[key_tuple] = builtins.min(timings, key=timings.get)
                self.configs_timings = timings
            config = self.cache[key_tuple]
        else:
            config = self.configs[0]
        self.best_config = config
        ret = self.fn.run(*args, **kwargs, **config.all_kwargs())
        self.nargs = None
        return ret

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)


def jit(fn: Any) -> JITFunction:
    return JITFunction(fn)


def autotune(
    configs: list[Config], key: list[str], do_bench: Any = None, cache_results: bool = False
) -> Any:
    def decorator(fn: JITFunction) -> Autotuner:
        return Autotuner(fn, fn.arg_names, configs, key, do_bench, cache_results)

    return decorator
