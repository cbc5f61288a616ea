"""A candidate's failure that a sandbox limit caused, said with the limit and its setting.

Inside the sandbox a limit shows up as an ordinary error of the candidate's code: a write past
RLIMIT_FSIZE fails with EFBIG ("File too large"), a fork past RLIMIT_NPROC with EAGAIN
("Resource temporarily unavailable"), an open past RLIMIT_NOFILE with EMFILE ("Too many open
files"). `limit_note` appends to such a reason which limit it was and the `SandboxLimits`
setting that sets it, so the user (and the model reading the next prompt) knows it was the
sandbox, not the kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.sandbox.task import SandboxLimits


def limit_note(reason: str | None, limits: SandboxLimits) -> str | None:
    """`reason` with the sandbox limit it names (module doc), unchanged otherwise."""
    if not reason:
        return reason
    notes = []
    if "File too large" in reason or "Errno 27]" in reason:
        notes.append(
            f"the sandbox's file size limit of {limits.scratch_limit_mb} MB "
            "(SandboxLimits.scratch_limit_mb)"
        )
    if "Too many open files" in reason or "Errno 24]" in reason:
        notes.append(
            f"the sandbox's limit of {limits.max_open_files} open files "
            "(SandboxLimits.max_open_files)"
        )
    if "Resource temporarily unavailable" in reason and any(
        word in reason for word in ("fork", "spawn", "thread", "Popen", "BlockingIOError")
    ):
        notes.append(
            f"the sandbox's limit of {limits.max_processes} processes and threads "
            "(SandboxLimits.max_processes)"
        )
    if not notes:
        return reason
    return f"{reason} [hit {'; '.join(notes)}]"
