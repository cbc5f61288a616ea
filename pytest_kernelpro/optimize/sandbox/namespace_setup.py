"""The sandbox's setup inside the namespaces: runs as PID 1, before any candidate code.

`python -I -S namespace_setup.py SPEC.json -- COMMAND...` (the command line that
`isolation.Isolation.wrap` builds; `python -m pytest_kernelpro.optimize.sandbox.isolation`
still works) calls `main` here: `setup(spec)` makes the mount namespace
what `isolation.py`'s docstring promises (every mount read-only but the scratch directory and
the build cache, a minimal /dev with the NVIDIA nodes, credential stores under $HOME and Unix
sockets covered, relaxations for CUDA where the probe needed them), verifies it (fail closed:
`SetupError`), then execs COMMAND (setpriv dropping every capability, then the worker).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def _outermost(paths: Sequence[str]) -> list[str]:
    out: list[str] = []
    for path in sorted(set(paths), key=len):
        if not _under(path, out):
            out.append(path)
    return out


def _build_view(spec: dict[str, Any], allowed: Sequence[str]) -> list[str]:
    """The allow-list view (`view.py`): an empty tmpfs over every hidden directory, then the
    shown paths and the writable ones bound back into it from the directory's old contents
    (reached through a file descriptor opened before the tmpfs covered them); returns a log.
    Verified: a hidden directory holds nothing but what was bound back."""
    hidden = [h for h in spec.get("hide") or [] if os.path.isdir(h)]
    keep = [*(spec.get("show") or []), *allowed]
    log = []
    for root in hidden:
        inside = _outermost([p for p in keep if _under(p, [root]) and p != root])
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        try:
            _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
            for path in inside:
                source = f"/proc/self/fd/{fd}/{os.path.relpath(path, root)}"
                if not os.path.exists(source):
                    continue
                os.makedirs(os.path.dirname(path), exist_ok=True)
                if os.path.isdir(source):
                    os.makedirs(path, exist_ok=True)
                else:
                    Path(path).touch()
                _mount(source, path, None, MS_BIND | MS_REC)
        finally:
            os.close(fd)
        expected = {os.path.relpath(p, root).split("/")[0] for p in inside}
        extra = sorted(set(os.listdir(root)) - expected)
        if extra:
            raise SetupError(f"{root} still shows {', '.join(extra[:8])} after it was hidden")
        log.append(f"{root}: {len(inside)} shown")
    covered = 0
    for path in spec.get("cover") or []:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue  # not visible in the view: nothing to cover
        if _under(path, list(allowed)):
            continue  # the candidate's own files
        if stat.S_ISDIR(mode):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=000,size=4k")
        elif stat.S_ISREG(mode) or stat.S_ISCHR(mode):
            _mount("/dev/null", path, None, MS_BIND)
        else:
            continue
        covered += 1
    return [
        "hidden (empty, only what the worker needs bound back): " + "; ".join(log),
        f"{covered} secret-looking paths covered",
    ]


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
    log += _build_view(spec, allowed)
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
    """`python -m pytest_kernelpro.optimize.sandbox.isolation SPEC.json -- COMMAND...` (PID 1 inside)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write(
            "usage: python -m pytest_kernelpro.optimize.sandbox.isolation SPEC.json -- CMD\n"
        )
        return 2
    spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    try:
        log = setup(spec)
    except (SetupError, OSError) as exc:
        sys.stderr.write(f"kernelpro sandbox: setup failed, the candidate does not run: {exc}\n")
        return 125
    os.unlink(args[0])
    if spec.get("file_limit_mb"):
        # No file the candidate writes may fill the disk (its scratch directory is on the
        # session's); Python ignores SIGXFSZ, so a write past it fails with EFBIG.
        size = int(spec["file_limit_mb"]) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        log.append(f"files limited to {spec['file_limit_mb']} MB")
    for key, limit, what in (
        ("process_limit", resource.RLIMIT_NPROC, "processes"),
        ("open_files_limit", resource.RLIMIT_NOFILE, "open files"),
    ):
        if spec.get(key):
            value = int(spec[key])
            hard = resource.getrlimit(limit)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(limit, (value, value))
            log.append(f"{what} limited to {value}")
    sys.stderr.write("kernelpro sandbox: " + "; ".join(log) + "\n")
    sys.stderr.flush()
    command = args[2:]
    os.execvp(command[0], command)
    return 127  # pragma: no cover - execvp does not return


# `Isolation.wrap` runs this file as a script (`python -I -S namespace_setup.py SPEC -- ...`):
# the standard library only, so PID 1 starts without importing the package.
if __name__ == "__main__":
    sys.exit(main())
