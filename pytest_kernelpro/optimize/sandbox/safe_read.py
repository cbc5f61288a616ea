"""Reading and removing what a candidate could have touched, without following its paths.

The session reads files in directories a candidate could write (its stdout and stderr logs,
its progress marks, its result, a judge's result, a standby's ready mark) as the session's
own user, outside every namespace. A path there is the candidate's: it may have replaced a
file with a symbolic link (to `/proc/self/environ`, to the project's `.env`), a hard link to
a file it could see, a FIFO (the read would block the session) or a device (`/dev/zero`: a
read without end). The rule here:

- a file the session created before the candidate ran is read through the descriptor the
  session kept (`read_tail_fd`): whatever happened to its name since, it is the same file;
- any other file is opened by name with `O_NOFOLLOW | O_NONBLOCK` relative to a directory
  opened the same way (`read_file`), and read only when `fstat` says it is a regular file
  with one link and at most `limit` bytes; anything else is an `UnsafeFile` naming what it
  found and where;
- a directory tree is removed without following a link (`remove_tree`: the descriptor-based
  walk of `shutil.rmtree`, which never descends into a link and never removes a link's
  target);
- `plain_dir` says whether a path below a root is directories all the way (no link on the
  way), for the code that moves or copies what a candidate left (its compile caches).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path
from typing import IO

# Files of a run the session reads (results, progress marks, ready marks): the largest an
# honest process writes is a result of a few hundred kilobytes.
DEFAULT_LIMIT = 16 * 1024 * 1024


class UnsafeFile(OSError):
    """A file a candidate could have touched is not one the session may read (the reason
    names the file and what it is)."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_nofollow(path: Path, flags: int) -> int:
    """A descriptor of `path` opened without following a link in its last component nor
    in its directory's; FIFOs open without waiting for a writer."""
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        return os.open(
            path.name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(errno.ELOOP, f"{path} is a symbolic link: not read") from None
        raise
    finally:
        os.close(directory)


def check_plain(fd: int, path: Path | str, limit: int | None) -> os.stat_result:
    """`fstat` of `fd`, refused (`UnsafeFile`) unless it is a regular file with one link
    and, with `limit`, at most `limit` bytes."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(errno.EINVAL, f"{path} is {_kind(st.st_mode)}: not read")
    if st.st_nlink != 1:
        raise UnsafeFile(
            errno.EMLINK, f"{path} has {st.st_nlink} hard links (a link to another file): not read"
        )
    if limit is not None and st.st_size > limit:
        raise UnsafeFile(errno.EFBIG, f"{path} holds {st.st_size} bytes, over {limit}: not read")
    return st


def read_file(path: Path | str, limit: int = DEFAULT_LIMIT) -> bytes:
    """The bytes of `path`, a file in a directory a candidate could write (module doc);
    `FileNotFoundError` when it is not there, `UnsafeFile` when it is not a plain file."""
    path = Path(path)
    fd = _open_nofollow(path, os.O_RDONLY)
    try:
        st = check_plain(fd, path, limit)
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: Path | str, limit: int = DEFAULT_LIMIT) -> str:
    """`read_file` decoded as UTF-8 (undecodable bytes replaced)."""
    return read_file(path, limit).decode("utf-8", errors="replace")


def read_tail_fd(fd: int, limit: int) -> bytes:
    """The last `limit` bytes of the file open at `fd` (the session's own descriptor of a
    file it created: the candidate's renames and links do not change which file it is)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return b""
    start = max(0, st.st_size - limit)
    return os.pread(fd, st.st_size - start, start)


def create_log(path: Path | str) -> IO[bytes]:
    """A new file for a process's output, open for reading and writing: the session reads
    it back through this descriptor (`read_tail_fd`). An existing link is refused (ELOOP)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(path, flags, 0o600)
    try:
        check_plain(fd, path, None)
        os.set_blocking(fd, True)  # the process writes through it: an ordinary file
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "w+b")


def plain_dir(root: Path, rel: str) -> bool:
    """True when `root/rel` is a directory reached through directories only: no component
    of `rel` is a link (moving or copying it follows nothing the candidate pointed)."""
    path = Path(root)
    for part in Path(rel).parts:
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
    return True


def remove_tree(path: Path | str) -> None:
    """Remove `path` and everything under it without following any link (module doc); a
    link at `path` itself is removed, never its target. Errors are ignored (a tree the
    session cannot remove is left, never a file outside it)."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return
    if not stat.S_ISDIR(mode):
        try:
            path.unlink()
        except OSError:
            pass
        return
    if not shutil.rmtree.avoids_symlink_attacks:  # pragma: no cover - every Linux Python has it
        raise RuntimeError("shutil.rmtree cannot remove a tree without following links here")
    shutil.rmtree(path, ignore_errors=True)


__all__ = [
    "DEFAULT_LIMIT",
    "UnsafeFile",
    "check_plain",
    "create_log",
    "plain_dir",
    "read_file",
    "read_tail_fd",
    "read_text",
    "remove_tree",
]
