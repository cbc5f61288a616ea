"""Operating-system isolation of a candidate's process (Linux namespaces through util-linux).

`Isolation.probe()` decides once per process what this machine allows, and `wrap()` turns the
worker's command line into one that runs it inside the sandbox:

    unshare --mount --pid --fork --kill-child --mount-proc --net --ipc --uts [--user
            --map-root-user] -- python -I -S .../namespace_setup.py SPEC.json -- \
        setpriv --bounding-set=-all --inh-caps=-all --ambient-caps=-all --no-new-privs -- \
        python -m pytest_kernelpro.optimize.sandbox.worker ...

What the candidate gets, and why each part:
- a PID namespace with its own /proc: the worker is PID 1, it sees no other process (no
  /proc/$PPID/environ of the session), and when it exits or is killed every process it left
  behind (a `setsid` child, a daemon) is killed by the kernel. `--kill-child` makes the
  namespace die with the `unshare` process the parent watches.
- a network namespace with only a loopback device that is down: no socket reaches anything.
  Unix sockets live in the file system, not in the network namespace: every socket file found
  in the session's /proc/net/unix and under /run, /tmp, /var/tmp and $HOME is covered with
  /dev/null.
- a mount namespace where every mount is read-only (bind remount, flags kept) except the
  candidate's scratch directory and the `writable` directories (the shared build cache);
  /proc is read-only too (no sysctl writes), /dev is a new tmpfs with only null, zero, full,
  random, urandom, tty, a fresh /dev/shm and the NVIDIA device nodes (the GPU stays usable),
  and the usual credential stores under $HOME (`SECRET_PATHS`: ~/.ssh, ~/.aws, ~/.netrc,
  ~/.config/gh, ...) are covered (the project often lives under $HOME, so the rest of it
  stays readable, read-only). Setup is verified before the candidate runs:
  a mount still writable outside the allowed directories aborts the worker (fail closed).
- no capabilities (bounding set, inheritable and ambient sets empty, no_new_privs): as root
  inside it cannot remount, unmount, load modules or write what the mounts forbid.
- IPC and UTS namespaces: no System V shared memory or semaphores of other processes.

When the machine cannot create the namespaces (a container without CAP_SYS_ADMIN and with
unprivileged user namespaces disabled), the fallback is weaker and says so: a scrubbed
environment, a new session whose process group is killed (a `setsid` child escapes it), the
parent's memory watchdog and nothing else. `mode="namespaces"` refuses the fallback.

Split by side: this module is the session's (the probe, the command line, the spec); the setup
that runs inside the namespaces as PID 1, before any candidate code (the mounts, /dev, the
covered credential stores and sockets, the verification), is `namespace_setup.py`. Its names
are re-exported here and `python -m pytest_kernelpro.optimize.sandbox.isolation` still runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.sandbox import cuda_probe, view
from pytest_kernelpro.optimize.sandbox.namespace_setup import (  # re-exported: see __all__
    DENIED_DEVICES,
    DEVICE_NODES,
    SECRET_PATHS,
    SOCKET_DIRS,
    SetupError,
    main,
    setup,
)

MODES = ("auto", "namespaces", "fallback")
SETUP_SCRIPT = str(Path(__file__).resolve().with_name("namespace_setup.py"))


@dataclass(frozen=True)
class Isolation:
    """What a sandboxed worker runs under: `namespaces` or the weaker `fallback`."""

    level: str  # "namespaces" | "fallback"
    why: str = ""  # for the fallback: what the probe found
    user_namespace: bool = False  # not root: `--user --map-root-user` as well
    unshare: str = "unshare"
    setpriv: str = "setpriv"
    # Parts of the mount setup left out because CUDA did not initialise with them (RELAXATIONS);
    # empty: the full sandbox.
    relax: tuple[str, ...] = ()
    # How the rung was decided (probed with which check, or cached from which file): for the
    # search's report. Not part of the isolation itself, so not compared.
    verdict: str = field(default="", compare=False)

    @property
    def isolated(self) -> bool:
        return self.level == "namespaces"

    def describe(self) -> str:
        """One line for logs and reports."""
        if self.isolated:
            relaxed = "".join(f"; relaxed for CUDA: {RELAXATIONS[r]}" for r in self.relax)
            return (
                "namespaces (pid, net, mount read-only, ipc, uts"
                + (", user" if self.user_namespace else "")
                + f"; no capabilities{relaxed})"
            )
        return f"fallback: scrubbed environment and process group only ({self.why})"

    def unshare_args(self) -> list[str]:
        args = [self.unshare]
        if self.user_namespace:
            args += ["--user", "--map-root-user"]
        return [
            *args,
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--net",
            "--ipc",
            "--uts",
        ]

    def wrap(
        self,
        command: Sequence[str],
        *,
        scratch: Path,
        writable: Sequence[Path] = (),
        readable: Sequence[Path] = (),
        python: str = sys.executable,
        file_limit_mb: int | None = None,
        env: Mapping[str, str] | None = None,
        process_limit: int | None = None,
        open_files_limit: int | None = None,
    ) -> list[str]:
        """The command line that runs `command` in the sandbox (unchanged for the fallback).

        `scratch` (the candidate's directory) and `writable` stay writable; `readable` are
        shown read-only besides what `view.needed_paths` finds (the project, caches);
        `env`: the process's environment, whose PATH, LD_LIBRARY_PATH and CUDA directories
        are shown too.
        """
        if not self.isolated:
            return list(command)
        spec = {
            **sandbox_spec(
                scratch=scratch, writable=writable, readable=readable, python=python, env=env
            ),
            "relax": list(self.relax),
            "file_limit_mb": file_limit_mb,
            "process_limit": process_limit,
            "open_files_limit": open_files_limit,
        }
        spec_path = scratch / "sandbox.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        drop = [
            self.setpriv,
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--no-new-privs",
            "--",
        ]
        # The setup (PID 1) imports the standard library only: run as a script, isolated
        # (-I) and without site (-S), it starts without importing this package or pytest
        # (a few hundred milliseconds of every candidate's start: bench/results/2026-12-05-sandbox-start-cpu.md).
        return [
            *self.unshare_args(),
            "--",
            python,
            "-I",
            "-S",
            SETUP_SCRIPT,
            str(spec_path),
            "--",
            *drop,
            *command,
        ]

    @classmethod
    def probe(
        cls, mode: str = "auto", *, cuda: bool = False, env: dict[str, str] | None = None
    ) -> Isolation:
        """What this machine allows (cached per mode and CUDA); `mode` is auto, namespaces or
        fallback. With `cuda=True` the sandbox must also let CUDA initialise: the full setup
        is tried first, then the `CUDA_LADDER` relaxations in order, each named in
        `describe()`; when none works, the fallback (with the reason). The CUDA verdict is
        the machine's cached one where valid (`cuda_probe`), else checked and cached."""
        if mode not in MODES:
            raise KernelproError(
                f"Invalid sandbox isolation mode {mode!r}: use one of {', '.join(MODES)}."
            )
        key = "cuda" if cuda else "auto"
        with _PROBE_LOCK:
            if "auto" not in _PROBED:
                _PROBED["auto"] = _probe()
            if cuda and "cuda" not in _PROBED:
                _PROBED["cuda"] = _probe_cuda(_PROBED["auto"], env)
            found = _PROBED[key]
        return _for_mode(mode, found)

    @classmethod
    def reprobe_cuda(
        cls, mode: str, failure: str, *, env: dict[str, str] | None = None
    ) -> Isolation | None:
        """A sandboxed run failed with CUDA's start-up error (`failure`) under a rung that
        the driver check or the machine's cache chose: probe the ladder again with the torch
        check (what torch itself needs), replace the cached verdict, and return the new
        isolation (its `verdict` says why); None when the rung in use was already the torch
        check's in this process (nothing new to learn). At most once per process."""
        with _PROBE_LOCK:
            current = _PROBED.get("cuda")
            # Decided by the torch check already (probed or cached): nothing new to learn.
            if current is None or _REPROBED or "(torch check" in current.verdict:
                return None
            _REPROBED.append(failure)
            base = _PROBED.get("auto") or _probe()
            found = _probe_cuda(base, env, check="torch")
            found = replace(
                found,
                verdict=f"re-probed with the torch check after CUDA did not start under "
                f"{current.describe()} ({failure[:200]}): {found.verdict}",
            )
            _PROBED["cuda"] = found
        return _for_mode(mode, found)


def _for_mode(mode: str, found: Isolation) -> Isolation:
    if mode == "fallback":
        return Isolation("fallback", why="requested (isolation='fallback')")
    if mode == "namespaces" and not found.isolated:
        raise KernelproError(
            f"The candidate sandbox needs Linux namespaces, but {found.why}. Run as root or "
            "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 "
            "or kernel.apparmor_restrict_unprivileged_userns=0), or accept the weaker "
            "fallback with isolation='auto'."
        )
    return found


_PROBE_LOCK = threading.Lock()
_PROBED: dict[str, Isolation] = {}
_REPROBED: list[str] = []  # the failure that made this process re-probe, once

# What each relaxation leaves out of the mount setup, weakest last. On an H200 host
# (bench/results/2026-12-01-sandbox-h200.md) CUDA failed to initialise in the
# full setup (cudaErrorOperatingSystem) while each namespace alone and the dropped
# capabilities left it working, so the ladder finds which part of the mount setup it needs.
RELAXATIONS = {
    "host_dev": "the host's /dev instead of a minimal one",
    "writable_proc": "/proc writable except /proc/sys and /proc/sysrq-trigger",
    "writable_tmp": "/tmp, /var/tmp, /run and /dev/shm writable",
}
CUDA_LADDER: tuple[tuple[str, ...], ...] = (
    (),
    ("host_dev",),
    ("host_dev", "writable_proc"),
    # No rung makes /tmp writable: a repository checked out under /tmp (CI clones often
    # are) would become writable with it. The H200 needs only the two rungs above.
)


def _probe_cuda(
    base: Isolation,
    env: dict[str, str] | None,
    *,
    check: str = "driver",
    cache: cuda_probe.VerdictCache | None = None,
) -> Isolation:
    """The first rung of `CUDA_LADDER` under which CUDA starts, else the fallback: from the
    machine's cached verdict when there is one, else by `cuda_probe.walk_ladder` (the
    driver check; "torch": the torch check), remembered for the next process."""
    if not base.isolated:
        return base
    cache = cuda_probe.VerdictCache.default() if cache is None else cache
    key = _machine_key(base, env)
    if check == "driver":
        cached = cache.load(key, CUDA_LADDER)
        if cached is not None:
            return replace(base, relax=cached.relax, verdict=cached.describe())
    else:
        cache.forget(key)  # the verdict it replaces did not hold: the next process re-checks

    def wrap(relax: tuple[str, ...], command: Sequence[str], scratch: Path) -> list[str]:
        return replace(base, relax=relax).wrap(command, scratch=scratch, env=env)

    found = cuda_probe.walk_ladder(CUDA_LADDER, wrap, env, check=check)
    if found.relax is None:
        return Isolation(
            "fallback",
            why="CUDA does not initialise inside the namespaces (tried "
            + "; ".join(found.tried)
            + ")",
            verdict=f"probed ({'/'.join(dict.fromkeys(found.checks))} check, "
            f"{found.seconds:.1f} s)",
        )
    stored = cache.store(key, found.relax, check=found.check, seconds=found.seconds)
    verdict = f"probed ({found.check} check, {found.seconds:.1f} s" + (
        f"; remembered in {stored})" if stored else "; not cached)"
    )
    return replace(base, relax=found.relax, verdict=verdict)


def _machine_key(base: Isolation, env: dict[str, str] | None) -> dict[str, Any] | None:
    return cuda_probe.machine_key(
        ladder=CUDA_LADDER,
        base={
            "user_namespace": base.user_namespace,
            "unshare": base.unshare,
            "setpriv": base.setpriv,
            "relaxations": RELAXATIONS,
        },
        env=env,
    )


def _probe() -> Isolation:
    if not sys.platform.startswith("linux"):
        return Isolation("fallback", why=f"not Linux ({sys.platform})")
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if not unshare or not setpriv:
        missing = " and ".join(n for n, p in (("unshare", unshare), ("setpriv", setpriv)) if not p)
        return Isolation("fallback", why=f"{missing} not found (util-linux)")
    candidate = Isolation(
        "namespaces", user_namespace=os.geteuid() != 0, unshare=unshare, setpriv=setpriv
    )
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="kernelpro-probe-"))
    try:
        check = [sys.executable, "-c", "import os; open('ok', 'w').write(str(os.getpid()))"]
        command = candidate.wrap(check, scratch=scratch)
        try:
            out = subprocess.run(
                command, cwd=scratch, capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return Isolation("fallback", why=f"unshare could not run: {exc}")
        written = (scratch / "ok").read_text() if (scratch / "ok").exists() else ""
        if out.returncode != 0 or written != "1":
            detail = (out.stderr or out.stdout).strip().splitlines()
            return Isolation(
                "fallback",
                why=f"namespaces unavailable: `unshare` exited {out.returncode}"
                + (f" ({detail[-1][:200]})" if detail else ""),
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return candidate


def confinement(isolation: Isolation, readable: Sequence[Path] = ()) -> Any:
    """A `build.cache.Confinement` that runs a compiler in `isolation`'s sandbox (the
    worker's): writing only its scratch and writable directories, seeing what a worker sees,
    dying with this process. In the fallback, the command as it is."""
    from pytest_kernelpro.optimize.sandbox.processes import die_with_parent

    def confine(command: list[str], scratch: Path, writable: list[Path]) -> list[str]:
        wrapped = isolation.wrap(command, scratch=scratch, writable=writable, readable=readable)
        return [*die_with_parent(), *wrapped] if isolation.isolated else wrapped

    return confine


def sandbox_spec(
    *,
    scratch: Path,
    writable: Sequence[Path] = (),
    readable: Sequence[Path] = (),
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What the setup inside the namespaces needs (computed in the session's process): the
    writable directories, and the allow-list view (`view.py`: hidden, shown, covered).

    With the session's project view (`project_view.session_view()`, registered by the
    evaluator), the project's directories are hidden like the home directory and only the
    view's files are bound back (`project_view.py`); without one, the directories named in
    `readable` and the working directory are shown whole, their secret-looking files
    covered (the deny-list of `view.covered_paths`)."""
    from pytest_kernelpro.optimize.sandbox.project_view import session_view

    home = os.environ.get("HOME", "")
    home = str(Path(home).resolve()) if home and Path(home).is_dir() else ""
    hide = view.hidden_roots(home)
    package = str(Path(view.__file__).resolve().parents[2])
    from pytest_kernelpro.optimize.build.cache import default_cache_dir

    needed = view.needed_paths(python, [*readable, os.getcwd(), default_cache_dir()], env)
    project = session_view()
    if project is not None:
        hide, needed, files = view.with_project(hide, needed, project.roots, project.files)
        projects: list[str] = []  # nothing of the project is shown whole: nothing to cover
    else:
        files = []
        projects = [
            os.path.realpath(p)
            for p in (os.getcwd(), package, *readable)
            if Path(p).is_dir()
            and not any(view.contains(os.path.realpath(p), hidden) for hidden in hide)
        ]
    show = [*view.shown_paths(needed, hide), *files]
    return {
        "scratch": str(Path(scratch).resolve()),
        "writable": [str(Path(p).resolve()) for p in writable],
        "home": home,
        "sockets": sorted(_socket_paths()),
        "hide": hide,
        "show": show,
        "cover": view.covered_paths(projects),
    }


def _socket_paths() -> set[str]:
    """Path names of the Unix sockets this process's network namespace knows."""
    found: set[str] = set()
    try:
        lines = Path("/proc/net/unix").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return found
    for line in lines[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith("/"):
            found.add(fields[7])
    return found


__all__ = [
    "CUDA_LADDER",
    "DENIED_DEVICES",
    "DEVICE_NODES",
    "MODES",
    "RELAXATIONS",
    "SECRET_PATHS",
    "SOCKET_DIRS",
    "Isolation",
    "SetupError",
    "confinement",
    "main",
    "sandbox_spec",
    "setup",
]

# `wrap()` runs `python -m pytest_kernelpro.optimize.sandbox.isolation SPEC.json -- ...` as PID 1 inside
# the namespaces; the setup itself is `namespace_setup.py`.
if __name__ == "__main__":
    sys.exit(main())
