"""What a failed candidate build says: the one-line reason of its evaluation and the build
log its debug prompt gets (the compiler's errors, trimmed, and where in the candidate the
build was called). Used inside the sandbox worker (`harness.py`)."""

from __future__ import annotations


def summarize_build_error(exc: BaseException) -> str:
    """First line of a build failure plus the first compiler `error` line, if any."""
    message = getattr(exc, "message", None)  # build.BuildError: already the trimmed log
    lines = [line.strip() for line in str(message or exc).splitlines() if line.strip()]
    head = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    for line in lines[1:]:
        if "error" in line.lower():
            return f"{head} | {line}"[:400]
    return head[:400]


def build_failure_log(exc: BaseException, traceback_text: str) -> str:
    """The build log a debug prompt gets: the compiler's errors (trimmed) where there are
    any, and where in the candidate the build was called; else the traceback."""
    from pytest_kernelpro.optimize.build.cache import BuildError
    from pytest_kernelpro.optimize.build.nvcc import trim_compiler_log

    frames = [
        line.strip() for line in traceback_text.splitlines() if '"<kernelpro_candidate>"' in line
    ]
    where = f"(raised at {frames[-1]})\n" if frames else ""
    if isinstance(exc, BuildError):
        return f"{where}{exc.message}"
    text = str(exc)
    if "Error building extension" in text or "error:" in text:  # load_inline / ninja output
        return f"{where}{type(exc).__name__}: {text.splitlines()[0] if text else ''}\n" + (
            trim_compiler_log(text)
        )
    return traceback_text
