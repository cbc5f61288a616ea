"""Operating-system isolation of a candidate's process (Linux namespaces through util-linux).

`Isolation.probe()` decides once per process what this machine allows, and `wrap()` turns the
worker's command line into one that runs it inside the sandbox:

    unshare --mount --pid --fork --kill-child --mount-proc --net --ipc --uts [--user
            --map-root-user] -- python -m pytest_kernelpro.search.isolation SPEC.json -- \
        setpriv --bounding-set=-all --inh-caps=-all --ambient-caps=-all --no-new-privs -- \
        python -m pytest_kernelpro.search.worker ...

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
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError

# mount(2) flags (linux/mount.h) and statvfs f_flag bits (sys/statvfs.h).
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE, MS_REC = 32, 1024, 2048, 4096, 8192, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
_ST_TO_MS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME}
_ST_NODIRATIME, _ST_RELATIME = 2048, 4096

# Credential stores under $HOME, covered with an empty directory or /dev/null.
SECRET_PATHS = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    ".npmrc",
    ".config/gh",
    ".config/gcloud",
    ".config/hub",
    ".config/anthropic",
    ".config/openai",
    ".anthropic",
    ".huggingface",
    ".cache/huggingface",
    ".claude",
    ".codex",
)
DEVICE_NODES = ("null", "zero", "full", "random", "urandom", "tty")
SOCKET_DIRS = ("/run", "/var/run", "/tmp", "/var/tmp")
MODES = ("auto", "namespaces", "fallback")


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
        python: str = sys.executable,
    ) -> list[str]:
        """The command line that runs `command` in the sandbox (unchanged for the fallback).

        `scratch` (the candidate's directory) and `writable` stay writable.
        """
        if not self.isolated:
            return list(command)
        spec = {**sandbox_spec(scratch=scratch, writable=writable), "relax": list(self.relax)}
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
        return [
            *self.unshare_args(),
            "--",
            python,
            "-m",
            "pytest_kernelpro.search.isolation",
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
        `describe()`; when none works, the fallback (with the reason)."""
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

# What each relaxation leaves out of the mount setup, weakest last. Measured on the H200
# (2026-12-01, bench/results/2026-12-01-sandbox-h200.md): CUDA failed to initialise in the
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
_CUDA_CHECK = (
    "import torch\n"
    "torch.zeros(1, device='cuda').add_(1)\n"
    "torch.cuda.synchronize()\n"
    "open('ok', 'w').write('cuda')\n"
)


def _probe_cuda(base: Isolation, env: dict[str, str] | None) -> Isolation:
    """The first rung of `CUDA_LADDER` under which CUDA initialises, else the fallback."""
    if not base.isolated:
        return base
    import tempfile
    from dataclasses import replace

    tried = []
    for relax in CUDA_LADDER:
        candidate = replace(base, relax=relax)
        scratch = Path(tempfile.mkdtemp(prefix="kernelpro-probe-cuda-"))
        try:
            command = candidate.wrap([sys.executable, "-c", _CUDA_CHECK], scratch=scratch)
            try:
                out = subprocess.run(
                    command,
                    cwd=scratch,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                tried.append(f"{'+'.join(relax) or 'full'}: {exc}")
                continue
            if (scratch / "ok").exists():
                return candidate
            last = [ln for ln in (out.stderr or out.stdout).splitlines() if ln.strip()]
            tried.append(
                f"{'+'.join(relax) or 'full'}: {last[-1][:160] if last else out.returncode}"
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return Isolation(
        "fallback",
        why="CUDA does not initialise inside the namespaces (tried " + "; ".join(tried) + ")",
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


def sandbox_spec(*, scratch: Path, writable: Sequence[Path] = ()) -> dict[str, Any]:
    """What the setup inside the namespaces needs (computed in the session's process)."""
    home = os.environ.get("HOME", "")
    return {
        "scratch": str(Path(scratch).resolve()),
        "writable": [str(Path(p).resolve()) for p in writable],
        "home": str(Path(home).resolve()) if home and Path(home).is_dir() else "",
        "sockets": sorted(_socket_paths()),
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


# ----- inside the namespaces (runs as PID 1, before any candidate code) -----


class SetupError(Exception):
    """The sandbox could not be set up as promised: the worker must not start."""


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    libc = _libc()
    rc = libc.mount(
        None if source is None else source.encode(),
        target.encode(),
        None if fstype is None else fstype.encode(),
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(
            err, f"mount {source} -> {target} ({fstype}, flags {flags:#x}): {os.strerror(err)}"
        )


def _kept_flags(path: str) -> int:
    """The mount's current flags that a bind remount must repeat (the kernel refuses to clear
    locked ones in a user namespace)."""
    f_flag = os.statvfs(path).f_flag
    flags = 0
    for st, ms in _ST_TO_MS.items():
        if f_flag & st:
            flags |= ms
    if f_flag & _ST_NODIRATIME:
        flags |= MS_NODIRATIME
    if f_flag & _ST_RELATIME:
        flags |= MS_RELATIME
    return flags


def _mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(_unescape(fields[4]))
    return points


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 3 < len(text) and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _build_dev(holder: str) -> None:
    """A new /dev: tmpfs with the basic nodes, a private /dev/shm and the NVIDIA nodes."""
    _mount("tmpfs", holder, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=1m")
    names = list(DEVICE_NODES) + sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    for name in names:
        src = f"/dev/{name}"
        if not os.path.exists(src):
            continue
        dst = f"{holder}/{name}"
        if os.path.isdir(src):
            os.mkdir(dst)
        else:
            Path(dst).touch()
        _mount(src, dst, None, MS_BIND | MS_REC)
    os.mkdir(f"{holder}/shm")
    _mount("tmpfs", f"{holder}/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{holder}/{name}")
    _mount(holder, "/dev", None, MS_MOVE)


def _hide_secrets(home: str) -> list[str]:
    """Cover the usual credential files and directories under $HOME (the project itself is
    often under $HOME too, so $HOME as a whole stays readable)."""
    hidden = []
    for rel in SECRET_PATHS:
        path = os.path.join(home, rel)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=000,size=4k")
        elif stat.S_ISREG(mode):
            _mount("/dev/null", path, None, MS_BIND)
        else:
            continue
        hidden.append(rel)
    return hidden


# Character devices of the host's /dev that root without capabilities could still misuse
# (raw memory, kernel log, loop and mapper control, virtualisation); every block device too.
DENIED_DEVICES = (
    "mem",
    "kmem",
    "port",
    "kmsg",
    "loop-control",
    "btrfs-control",
    "fuse",
    "kvm",
    "userfaultfd",
    "vsock",
    "vhost-net",
    "vhost-vsock",
    "hwrng",
    "watchdog",
    "watchdog0",
    "mapper",
    "cpu",
    "disk",
    "mqueue",
)


def _cover_host_devices() -> int:
    """With the host's /dev kept: /dev/null over every block device and denied node, an
    empty tmpfs over denied directories."""
    covered = 0
    for dirpath in ("/dev", *(f"/dev/{d}" for d in ("block", "bus"))):
        try:
            names = os.listdir(dirpath)
        except OSError:
            continue
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            denied = dirpath == "/dev" and name in DENIED_DEVICES
            try:
                if stat.S_ISBLK(mode) or (denied and stat.S_ISCHR(mode)):
                    _mount("/dev/null", path, None, MS_BIND)
                    covered += 1
                elif denied and stat.S_ISDIR(mode):
                    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k")
                    covered += 1
            except OSError:
                continue
    return covered


def _cover_sockets(spec: dict[str, Any]) -> int:
    paths = set(spec.get("sockets") or [])
    roots = [*SOCKET_DIRS, *([spec["home"]] if spec.get("home") else [])]
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            if dirpath.count("/") - root.count("/") >= 4:
                dirnames[:] = []
            for name in filenames:
                full = os.path.join(dirpath, name)
                try:
                    if stat.S_ISSOCK(os.lstat(full).st_mode):
                        paths.add(full)
                except OSError:
                    continue
    covered = 0
    for path in sorted(paths):
        if _under(path, [spec["scratch"]]):
            continue
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                _mount("/dev/null", path, None, MS_BIND)
                covered += 1
        except OSError:
            continue  # gone, or below a path already covered
    return covered


def setup(spec: dict[str, Any]) -> list[str]:
    """Make the mount namespace what the module docstring promises; returns a log."""
    scratch, writable = spec["scratch"], list(spec.get("writable") or [])
    relax = set(spec.get("relax") or [])
    if "writable_tmp" in relax:
        writable += [p for p in ("/tmp", "/var/tmp", "/run", "/dev/shm") if os.path.isdir(p)]
    allowed = [scratch, *writable]
    log = [f"relaxed: {', '.join(sorted(relax))}"] if relax else []
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Own mounts for the writable directories first: the read-only pass leaves them alone.
    for path in allowed:
        if os.path.isdir(path):
            _mount(path, path, None, MS_BIND | MS_REC)
    holder = os.path.join(scratch, ".kernelpro-mnt")
    os.mkdir(holder, 0o700)
    if spec.get("home") and spec["home"] != "/":
        hidden = _hide_secrets(spec["home"])
        log.append(f"{len(hidden)} credential paths under {spec['home']} hidden")
    log.append(f"{_cover_sockets(spec)} socket files covered")
    if "host_dev" not in relax:
        _build_dev(holder)
    os.rmdir(holder)
    if "host_dev" in relax:
        log.append(f"host /dev kept, {_cover_host_devices()} dangerous device nodes covered")
        allowed.append("/dev")
    if "writable_proc" in relax:
        # Sysctls stay read-only whatever happens: root without capabilities could still
        # write some of them (kernel.core_pattern runs a program as root on the host).
        for path in ("/proc/sys", "/proc/sysrq-trigger"):
            if not os.path.exists(path):
                continue
            _mount(path, path, None, MS_BIND)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags(path))
        allowed.append("/proc")
    skipped = []
    for point in _mount_points():
        if _under(point, allowed) or point.startswith("/dev/"):
            continue
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags(point))
        except OSError as exc:
            skipped.append(f"{point}: {exc.strerror}")
    # Verify: nothing outside the allowed directories (and the device nodes) is writable.
    writable_left = []
    for point in _mount_points():
        if _under(point, allowed) or point.startswith("/dev/"):
            continue
        try:
            if not os.statvfs(point).f_flag & 1:
                writable_left.append(point)
        except OSError:
            continue  # shadowed by a mount above it: not reachable
    if writable_left:
        raise SetupError(
            "could not make these mounts read-only: "
            + ", ".join(writable_left[:8])
            + (f" (remount errors: {'; '.join(skipped[:4])})" if skipped else "")
        )
    log.append("all mounts read-only except " + ", ".join(allowed))
    # The working directory still points into the mount it had before the bind mounts
    # above: resolve it again so that the scratch directory's writable mount is used.
    os.chdir(os.getcwd())
    return log


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pytest_kernelpro.search.isolation SPEC.json -- COMMAND...` (PID 1 inside)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: python -m pytest_kernelpro.search.isolation SPEC.json -- CMD\n")
        return 2
    spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    try:
        log = setup(spec)
    except (SetupError, OSError) as exc:
        sys.stderr.write(f"kernelpro sandbox: setup failed, the candidate does not run: {exc}\n")
        return 125
    os.unlink(args[0])
    sys.stderr.write("kernelpro sandbox: " + "; ".join(log) + "\n")
    sys.stderr.flush()
    command = args[2:]
    os.execvp(command[0], command)
    return 127  # pragma: no cover - execvp does not return


__all__ = ["Isolation", "SetupError", "main", "sandbox_spec", "setup"]

if __name__ == "__main__":
    sys.exit(main())
