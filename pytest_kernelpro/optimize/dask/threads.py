"""The thread settings a candidate on a Dask worker gets: the session's, not the nanny's.

Dask's nanny starts every worker with `OMP_NUM_THREADS=1`, `MKL_NUM_THREADS=1` and
`OPENBLAS_NUM_THREADS=1` (its `distributed.nanny.pre-spawn-environ`), names the sandbox's
allow-list passes on, which would make every CPU candidate, and the CPU side of the checks,
single-threaded on Dask only. The session's values of those names (or their absence,
`session_thread_environment`) travel with each task, and `with_thread_environment` puts them
in place of the worker's in the candidate's environment.
"""

from __future__ import annotations

import os


def nanny_thread_variables() -> tuple[str, ...]:
    """The names Dask's nanny sets in a worker before starting it (its
    `distributed.nanny.pre-spawn-environ`) that the sandbox passes on to a candidate."""
    from pytest_kernelpro.optimize.sandbox.environment import scrub_environment

    try:
        import dask

        names = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    except ImportError:
        return ()
    return tuple(sorted(scrub_environment(dict.fromkeys(names, ""))))


def session_thread_environment() -> dict[str, str | None]:
    """This process's values of `nanny_thread_variables()` (None: not set here)."""
    return {name: os.environ.get(name) for name in nanny_thread_variables()}


def with_thread_environment(
    env: dict[str, str], thread_env: dict[str, str | None] | None
) -> dict[str, str]:
    """`env` with the session's values of the nanny's names (None: removed)."""
    for name, value in (thread_env or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env
