"""Which rung of the CUDA ladder lets CUDA start inside the namespaces: checked cheaply,
remembered per machine, re-checked when a sandboxed run says CUDA did not start.

`isolation.Isolation.probe(cuda=True)` walks `CUDA_LADDER` from the full sandbox to the most
relaxed rung and takes the first under which CUDA starts. What each rung runs:

- the driver check (`DRIVER_CHECK`): a Python without torch that loads `libcuda.so.1` through
  ctypes and does what CUDA's start-up needs of the sandbox (cuInit, a device, its primary
  context, a device allocation, a memset, a synchronize). It costs an interpreter start and
  the driver's initialisation, not `import torch` (about 5 s a rung on the H200). Everything
  it does torch's CUDA start does too, so a rung it rejects is one torch would fail in: it
  never picks a weaker rung than the torch check would. It may accept a rung torch needs
  more of; a sandboxed run that then fails with `CUDA_INIT_SIGNATURES` re-probes with:
- the torch check (`TORCH_CHECK`, what every rung ran before): `import torch`, a tensor on
  the GPU, a synchronize. Also used for a rung where libcuda cannot be loaded at all.

The verdict is cached for the machine (`VerdictCache`): one JSON file per key in the user's
cache directory (`$KERNELPRO_ISOLATION_CACHE`, else `$XDG_CACHE_HOME/kernelpro/isolation`,
else `~/.cache/kernelpro/isolation`; `KERNELPRO_ISOLATION_CACHE=off` turns it off), written
atomically. The key is everything the verdict depends on: the user, the boot, the mount
namespace, the NVIDIA driver and its parameters, the device nodes in /dev, the visible
devices, the sandbox's own code and the ladder. A cached entry is used only when its key is
exactly today's, it is younger than `MAX_AGE_S`, it names a rung of today's ladder, and the
file and its directory belong to this user and no one else can write them. Only namespace
verdicts are cached, never the fallback: a machine whose CUDA does not start in any rung is
probed again in every process, so the weaker isolation is never remembered.

Why a cached verdict cannot weaken the sandbox: inside the namespaces the cache directory is
read-only (all of $HOME is), so no candidate can write an entry; the only writer is a
session process. A candidate that runs under the explicit fallback (no namespaces) could
write one, but such a candidate can already write the user's files and the package itself,
so the cache adds nothing to what it can do. Whatever the source, the verdict is named in
the search's report (`Isolation.verdict`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro.fileio import atomic_write_json

CACHE_ENV = "KERNELPRO_ISOLATION_CACHE"
CACHE_FORMAT = 1
MAX_AGE_S = 24 * 3600.0  # a day: a verdict is re-checked at least this often
EXIT_NO_DRIVER = 3  # the driver check could not load libcuda.so.1
# Where the key reads the boot and the NVIDIA driver's version (the first that exists).
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
DRIVER_FILES = ("/proc/driver/nvidia/version", "/sys/module/nvidia/version")

# The driver check: the sandbox-facing part of CUDA's start (no torch). Writes `ok` into its
# working directory (the rung's scratch) only when every call succeeded.
DRIVER_CHECK = r"""
import ctypes, sys
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    sys.stderr.write(f"no driver library: {exc}\n")
    sys.exit(3)
def call(name, *args):
    rc = getattr(cuda, name)(*args)
    if rc != 0:
        text = ctypes.c_char_p()
        try:
            cuda.cuGetErrorName(rc, ctypes.byref(text))
        except AttributeError:
            pass
        what = (text.value or b"CUDA error").decode(errors="replace")
        sys.stderr.write(f"{name}: {what} ({rc})\n")
        sys.exit(1)
call("cuInit", 0)
count = ctypes.c_int(0)
call("cuDeviceGetCount", ctypes.byref(count))
if count.value < 1:
    sys.stderr.write("cuDeviceGetCount: no CUDA device\n")
    sys.exit(1)
device = ctypes.c_int(0)
call("cuDeviceGet", ctypes.byref(device), 0)
context = ctypes.c_void_p()
call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
call("cuCtxSetCurrent", context)
pointer = ctypes.c_uint64(0)
call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(1 << 20))
call("cuMemsetD32_v2", pointer, ctypes.c_uint(1), ctypes.c_size_t(1 << 18))
call("cuCtxSynchronize")
call("cuMemFree_v2", pointer)
call("cuDevicePrimaryCtxRelease", device)
open("ok", "w").write("cuda")
"""
TORCH_CHECK = (
    "import torch\n"
    "torch.zeros(1, device='cuda').add_(1)\n"
    "torch.cuda.synchronize()\n"
    "open('ok', 'w').write('cuda')\n"
)

# What a sandboxed run's log says when CUDA itself did not start (the driver's and torch's
# messages for it): the sign that the rung in use is not enough for CUDA.
CUDA_INIT_SIGNATURES = (
    "cudaErrorOperatingSystem",
    "CUDA_ERROR_OPERATING_SYSTEM",
    "OS call failed or operation not supported on this OS",
    "cudaErrorInitializationError",
    "CUDA_ERROR_NOT_INITIALIZED",
    "CUDA driver initialization failed",
    "cudaErrorNoDevice",
    "no CUDA-capable device is detected",
    "Found no NVIDIA driver on your system",
)


def cuda_init_failure(text: str) -> str | None:
    """The line of `text` that says CUDA did not start, or None."""
    for line in text.splitlines():
        if any(sig in line for sig in CUDA_INIT_SIGNATURES):
            return line.strip()[:300]
    return None


Wrapper = Callable[[tuple[str, ...], Sequence[str], Path], list[str]]


@dataclass
class LadderResult:
    """The first rung CUDA started in (None: none), what each rung tried, which check."""

    relax: tuple[str, ...] | None
    tried: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)  # "driver" or "torch", per rung tried
    seconds: float = 0.0

    @property
    def check(self) -> str:
        """The check that decided the verdict (the last rung's)."""
        return self.checks[-1] if self.checks else ""


def walk_ladder(
    ladder: Sequence[tuple[str, ...]],
    wrap: Wrapper,
    env: Mapping[str, str] | None,
    *,
    check: str = "driver",
    timeout_s: float = 120.0,
    python: str = sys.executable,
) -> LadderResult:
    """Try each rung of `ladder` with `check` ("driver": the ctypes check, the torch check
    where libcuda cannot be loaded; "torch": the torch check only). `wrap(relax, command,
    scratch)` is the sandboxed command line of `command` under that rung."""
    started = time.perf_counter()
    result = LadderResult(relax=None)
    for relax in ladder:
        name = "+".join(relax) or "full"
        kinds = ["driver", "torch"] if check == "driver" else ["torch"]
        outcome = ""
        for kind in kinds:
            ok, outcome, code = _run_check(kind, relax, wrap, env, timeout_s, python)
            if ok:
                result.relax = tuple(relax)
                result.checks.append(kind)
                result.seconds = time.perf_counter() - started
                return result
            if not (kind == "driver" and code == EXIT_NO_DRIVER):
                result.checks.append(kind)
                break  # the driver said no: torch would not start either
        result.tried.append(f"{name}: {outcome}")
    result.seconds = time.perf_counter() - started
    return result


def _run_check(
    kind: str,
    relax: tuple[str, ...],
    wrap: Wrapper,
    env: Mapping[str, str] | None,
    timeout_s: float,
    python: str,
) -> tuple[bool, str, int | None]:
    program = DRIVER_CHECK if kind == "driver" else TORCH_CHECK
    scratch = Path(tempfile.mkdtemp(prefix="kernelpro-probe-cuda-"))
    try:
        command = wrap(tuple(relax), [python, "-c", program], scratch)
        try:
            out = subprocess.run(
                command,
                cwd=scratch,
                env=None if env is None else dict(env),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return False, str(exc), None
        if (scratch / "ok").exists():
            return True, "", 0
        lines = [
            ln
            for ln in (out.stderr or out.stdout).splitlines()
            if ln.strip() and not ln.startswith("kernelpro sandbox: ")
        ]
        return False, (lines[-1][:160] if lines else f"exit {out.returncode}"), out.returncode
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ----- the verdict cache -----


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _code_version() -> str:
    """Digest of the sandbox's own code: a changed setup or ladder is probed again."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in ("isolation.py", "namespace_setup.py", "cuda_probe.py"):
        try:
            digest.update((here / name).read_bytes())
        except OSError:
            digest.update(name.encode())
    return digest.hexdigest()[:16]


def machine_key(
    *,
    ladder: Sequence[tuple[str, ...]],
    base: Mapping[str, Any],
    env: Mapping[str, str] | None,
) -> dict[str, Any] | None:
    """What a verdict is valid for; None when this machine cannot say (no boot id, no
    NVIDIA driver): nothing is cached then."""
    boot = _read(BOOT_ID_FILE)
    driver = next((text for text in map(_read, DRIVER_FILES) if text), "")
    if not boot or not driver:
        return None
    try:
        mount_ns = os.readlink("/proc/self/ns/mnt")
    except OSError:
        mount_ns = ""
    try:
        dev = sorted(os.listdir("/dev"))
    except OSError:
        dev = []
    source = os.environ if env is None else env
    return {
        "format": CACHE_FORMAT,
        "uid": os.geteuid(),
        "boot_id": boot,
        "mount_namespace": mount_ns,
        "driver": driver.splitlines()[0],
        "driver_params": _digest(_read("/proc/driver/nvidia/params")),
        "dev": _digest("\n".join(dev)),
        "visible_devices": [
            source.get(n, "") for n in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
        ],
        "code": _code_version(),
        "ladder": [list(r) for r in ladder],
        "base": dict(base),
    }


def cache_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where verdicts live; None when the cache is off."""
    env = os.environ if environ is None else environ
    chosen = env.get(CACHE_ENV, "")
    if chosen.lower() in ("off", "0", "no", "false"):
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernelpro" / "isolation"


def _private(path: Path) -> bool:
    """Owned by this user and writable by no one else (a shared cache directory, or a file
    another user planted, is not trusted)."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


@dataclass(frozen=True)
class CachedVerdict:
    relax: tuple[str, ...]
    check: str
    probed_at: float
    path: Path

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.probed_at))
        return f"cached ({self.check} check at {when}, {self.path})"


class VerdictCache:
    """The machine's CUDA-ladder verdicts, one file per key (module doc)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    @classmethod
    def default(cls) -> VerdictCache:
        return cls(cache_dir())

    def path(self, key: Mapping[str, Any]) -> Path | None:
        if self.directory is None:
            return None
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        return self.directory / f"cuda-{digest}.json"

    def load(
        self,
        key: Mapping[str, Any] | None,
        ladder: Sequence[tuple[str, ...]],
        *,
        now: float | None = None,
    ) -> CachedVerdict | None:
        """The cached verdict for `key`, or None (missing, stale, foreign, not a rung)."""
        path = self.path(key) if key is not None else None
        if path is None or not path.is_file():
            return None
        if not (_private(path) and _private(path.parent)):
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("key") != json.loads(json.dumps(key)):
            return None
        relax = data.get("relax")
        rungs = [list(r) for r in ladder]
        if data.get("level") != "namespaces" or not isinstance(relax, list) or relax not in rungs:
            return None
        probed_at = data.get("probed_at")
        if isinstance(probed_at, bool) or not isinstance(probed_at, (int, float)):
            return None
        age = (time.time() if now is None else now) - float(probed_at)
        if not 0 <= age <= MAX_AGE_S:
            return None
        check = str(data.get("check") or "")
        if check not in ("driver", "torch"):
            return None
        return CachedVerdict(tuple(relax), check, float(probed_at), path)

    def store(
        self, key: Mapping[str, Any] | None, relax: tuple[str, ...], *, check: str, seconds: float
    ) -> Path | None:
        """Remember a namespace verdict (atomically); None when not cached."""
        path = self.path(key) if key is not None else None
        if path is None:
            return None
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not _private(path.parent):
                return None  # a directory others can write: never trusted, never written
            atomic_write_json(
                path,
                {
                    "key": dict(key or {}),
                    "level": "namespaces",
                    "relax": list(relax),
                    "check": check,
                    "probed_at": time.time(),
                    "probe_s": round(seconds, 3),
                },
            )
            os.chmod(path, 0o600)
        except OSError:
            return None
        return path

    def forget(self, key: Mapping[str, Any] | None) -> None:
        path = self.path(key) if key is not None else None
        if path is not None:
            path.unlink(missing_ok=True)


__all__ = [
    "CACHE_ENV",
    "CUDA_INIT_SIGNATURES",
    "DRIVER_CHECK",
    "MAX_AGE_S",
    "TORCH_CHECK",
    "CachedVerdict",
    "LadderResult",
    "VerdictCache",
    "cache_dir",
    "cuda_init_failure",
    "machine_key",
    "walk_ladder",
]
