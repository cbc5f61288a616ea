"""What a sandboxed process sees of the file system: an allow-list, computed in the session.

The sandbox's mount namespace (`namespace_setup.setup`) is built from three lists this
module computes before the sandbox starts:

- `hide`: directories covered with an empty tmpfs. Every top-level directory that is not a
  system directory (`SYSTEM_DIRS`: /usr, /etc, /opt, /proc, ...) is hidden: /home, /root,
  /tmp, /mnt, /srv and whatever a machine adds (/work, /data, /workspace), and the user's
  $HOME wherever it is; /var/tmp and /run/secrets too. What a user keeps there (credential
  stores, other checkouts, tokens) does not exist for the candidate.
- `show`: what is bound back, read-only, into the hidden directories: what the worker needs
  to run and nothing else: the Python installation and every `sys.path` entry, the
  directories of PATH, LD_LIBRARY_PATH and the CUDA variables, this package, the project
  (the task's `sys.path`, the session's working directory) and the caches the caller names
  (the build cache, read-only). A path that is a hidden directory itself or holds one (the
  home directory as a whole, `/`) is never shown.
- `cover`: secret-looking files and directories inside what is shown (`.env*`, keys,
  certificates, credential stores, `.git/config` with its tokens; `SECRET_NAMES`) and the
  system's own (/etc/shadow, SSH host keys): covered with /dev/null or an empty tmpfs. The
  projects are scanned once per process (`secret_files`), pruned at virtual environments,
  `site-packages` and `node_modules`, and bounded (`SCAN_LIMIT` entries per root).
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

# Top-level directories that stay visible (read-only): the system's programs, libraries and
# configuration, the driver's files, the kernel's views.
SYSTEM_DIRS = frozenset(
    {
        "usr",
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "etc",
        "opt",
        "proc",
        "sys",
        "dev",
        "run",
        "var",
        "nix",
        "snap",
        "boot",
    }
)
# Below the visible system directories, still hidden.
HIDDEN_SYSTEM = ("/var/tmp", "/run/secrets", "/run/user", "/var/run/secrets")
# Files of the system that hold secrets (root without capabilities still owns them).
SYSTEM_SECRETS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/ssl/private",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
)
# File and directory names that look like a secret (fnmatch patterns, case-insensitive).
SECRET_NAMES = (
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.crt",
    "*.cer",
    "*.der",
    "*.ovpn",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".vault-token",
    ".htpasswd",
    ".dockercfg",
    "credentials",
    "credentials.*",
    "*.credentials",
    "secrets",
    "secrets.*",
    "*secret*.json",
    "*secret*.yaml",
    "*secret*.yml",
    "*token*.json",
    "service-account*.json",
    "kubeconfig",
    ".ssh",
    ".aws",
    ".gnupg",
    ".docker",
    ".kube",
    ".azure",
)
# Directories not descended into by the scan: installed packages and caches, not the project.
PRUNE = frozenset(
    {
        ".venv",
        "venv",
        "site-packages",
        "dist-packages",
        "node_modules",
        "__pycache__",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        "build",
        "dist",
        ".eggs",
    }
)
SCAN_LIMIT = 200_000  # entries per root; a bigger project is scanned this far, and says so
_PATH_VARIABLES = (
    "PATH",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "LIBRARY_PATH",
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUTLASS_PATH",
    "CONDA_PREFIX",
    "VIRTUAL_ENV",
)


def _real(path: str | os.PathLike[str]) -> str | None:
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return None
    return real if os.path.exists(real) else None


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def contains(path: str, inner: str) -> bool:
    """True when `path` is `inner` or one of its parents (showing it would undo hiding)."""
    return _under(inner, path)


def hidden_roots(home: str = "", root: str = "/") -> list[str]:
    """The directories covered with an empty tmpfs (module doc), outermost only."""
    found: list[str] = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        names = []
    for name in names:
        path = os.path.join(root, name)
        if name in SYSTEM_DIRS or os.path.islink(path) or not os.path.isdir(path):
            continue
        found.append(path)
    extra = [p for p in (*HIDDEN_SYSTEM, home) if p]
    for path in extra:
        real = _real(path)
        if real and os.path.isdir(real) and real != "/" and real not in found:
            found.append(real)
    return outermost(found)


def outermost(paths: Iterable[str]) -> list[str]:
    """`paths` without those inside another one (/home covers /home/user), shortest first."""
    outer: list[str] = []
    for path in sorted(dict.fromkeys(paths), key=len):
        if not any(_under(path, o) for o in outer):
            outer.append(path)
    return outer


def needed_paths(
    python: str = sys.executable,
    extra: Iterable[str | os.PathLike[str]] = (),
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """What a worker needs to see (module doc), real paths that exist."""
    candidates: list[str | os.PathLike[str]] = [
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.dirname(os.path.abspath(python))),
        os.path.dirname(os.path.dirname(os.path.realpath(python))),
        *(p for p in sys.path if p),
        Path(__file__).resolve().parents[2],  # this package (not the checkout holding it)
        *extra,
    ]
    for environ in (os.environ, env or {}):
        for name in _PATH_VARIABLES:
            value = environ.get(name, "")
            candidates += [p for p in value.split(os.pathsep) if p.startswith("/")]
    out: list[str] = []
    for path in candidates:
        real = _real(path)
        for part in _venv_parts(real) if real else []:
            if part not in out:
                out.append(part)
    return out


# What the interpreter needs of a virtual environment: its programs, libraries, headers and
# pyvenv.cfg; not what else sits at its top (pip.conf with an index password, etc/, share/).
VENV_PARTS = ("bin", "lib", "lib64", "include", "pyvenv.cfg")


def _venv_parts(path: str) -> list[str]:
    """`path`, or for a virtual environment's top directory its `VENV_PARTS`."""
    if not os.path.isfile(os.path.join(path, "pyvenv.cfg")):
        return [path]
    parts = [os.path.join(path, p) for p in VENV_PARTS]
    return [real for p in parts if (real := _real(p)) is not None]


def shown_paths(needed: Sequence[str], hidden: Sequence[str]) -> list[str]:
    """The needed paths inside a hidden directory (bound back), outermost only; a path that
    is a hidden directory or holds one is left out (it would undo the hiding)."""
    inside = [
        p
        for p in needed
        if any(_under(p, h) for h in hidden) and not any(_under(h, p) for h in hidden)
    ]
    inside.sort(key=len)
    outer: list[str] = []
    for path in inside:
        if not any(_under(path, o) for o in outer):
            outer.append(path)
    return outer


def _installed(path: str) -> bool:
    """Under the interpreter's prefixes: installed software, not the project."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return any(_under(path, p) for p in prefixes)


def with_project(
    hidden: Sequence[str],
    needed: Sequence[str],
    roots: Sequence[str],
    files: Iterable[str],
) -> tuple[list[str], list[str], list[str]]:
    """The view with a project allow-list (`project_view.py`): the project's directories
    hidden too, the needed paths inside them dropped unless they are installed software (a
    virtual environment inside the project) or this package, and the project's files to
    bind back. Returns (hidden, needed, files)."""
    package = str(Path(__file__).resolve().parents[2])
    # Never hidden: a root holding a system directory or the base interpreter (hiding it
    # would hide the libraries the interpreter loads; such a root is not a project).
    system = [f"/{d}" for d in SYSTEM_DIRS] + [os.path.realpath(sys.base_prefix)]
    usable = [r for r in roots if not any(_under(s, r) for s in system)]
    outer = outermost([*hidden, *usable])
    kept = [
        n
        for n in needed
        if not any(_under(n, r) for r in usable) or _installed(n) or _under(n, package)
    ]
    return outer, kept, sorted(files)


# Program files are never covered (a `secrets.py` module is code, not a secret).
CODE_SUFFIXES = (".py", ".pyc", ".pyi", ".so", ".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh")


def _is_secret(name: str) -> bool:
    lower = name.lower()
    if lower.endswith(CODE_SUFFIXES):
        return False
    return any(fnmatch.fnmatchcase(lower, pattern) for pattern in SECRET_NAMES)


_SCANS: dict[str, tuple[dict[str, int], tuple[str, ...]]] = {}


def secret_files(root: str) -> tuple[str, ...]:
    """Secret-looking files and directories under `root` (module doc), and `.git/config`.

    Remembered per root with the modification time of every directory it walked: a file
    created or renamed since changes its directory's time, and the root is scanned again."""
    cached = _SCANS.get(root)
    if cached is not None and _unchanged(cached[0]):
        return cached[1]
    found: list[str] = []
    walked: dict[str, int] = {}
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        try:
            walked[dirpath] = os.stat(dirpath).st_mtime_ns
        except OSError:
            continue
        seen += len(dirnames) + len(filenames)
        if seen > SCAN_LIMIT:
            break
        keep = []
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if name == ".git":
                config = os.path.join(full, "config")
                if os.path.isfile(config):
                    found.append(config)
                continue
            if _is_secret(name):
                found.append(full)
            elif name not in PRUNE and not os.path.islink(full):
                keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            if _is_secret(name):
                found.append(os.path.join(dirpath, name))
    result = tuple(found)
    if len(_SCANS) > 64:
        _SCANS.clear()
    _SCANS[root] = (walked, result)
    return result


def _unchanged(walked: dict[str, int]) -> bool:
    for path, mtime in walked.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return False
        except OSError:
            return False
    return True


def covered_paths(projects: Sequence[str]) -> list[str]:
    """The secret-looking paths to cover: in the projects (the repository, the task's
    directories; not installed software) and the system's own (`SYSTEM_SECRETS`)."""
    roots = [
        p
        for p in dict.fromkeys(projects)
        if os.path.isdir(p) and p != "/" and not any(part in PRUNE for part in Path(p).parts)
    ]
    out = [p for p in SYSTEM_SECRETS if os.path.lexists(p)]
    for root in roots:
        out += [p for p in secret_files(root) if p not in out]
    return out
