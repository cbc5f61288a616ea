"""`--kernelpro-isolate`: run one kernel item in its own pytest subprocess.

A segfault, an `os._exit`, an out-of-memory kill or a CUDA error that breaks the context then
ends only the child; the parent turns what happened into that item's failure and the session
goes on. The child is pytest itself, on the item's node id, with the parent's settings (each
resolved setting passed as its `KERNELPRO_*` variable, the session flags on its command line)
and its own JSON report in a temporary directory: the record it logs there is the item's
record. The parent enforces the item time limit (plus `STARTUP_ALLOWANCE_S` for the child's
start) by killing the child's process group, and waits until every process of that group is
gone and no longer holds a GPU context (NVML's list of compute processes) before the next
item's child starts: a child killed while its kernel spins on the GPU must not leave the GPU
busy for the next one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_kernelpro.config import SETTINGS
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.record import KernelRecord

if TYPE_CHECKING:
    import pytest

    from pytest_kernelpro.run.items import KernelItem
    from pytest_kernelpro.run.session import KernelproSession

CHILD_FLAG = "--kernelpro-isolated-child"  # hidden option: this process is an item's child
STARTUP_ALLOWANCE_S = 60.0  # python + pytest + torch start-up in the child
RELEASE_WAIT_S = 30.0  # after a kill: how long to wait for the group and its GPU contexts
OUTPUT_TAIL_LINES = 25


def plugin_arguments(config: pytest.Config) -> list[str]:
    """`-p MODULE` for each pytest-kernelpro plugin module this process has from anything but
    its entry point (`-p` with PYTEST_DISABLE_PLUGIN_AUTOLOAD, or a checkout on PYTHONPATH
    without `pip install`): the child inherits the environment, so it would start without the
    plugin and reject its own `--kernelpro-*` flags ("unrecognized arguments"). Nothing for a
    plugin its entry point loaded: a second registration would be an error."""
    by_entry_point = {id(plugin) for plugin, _ in config.pluginmanager.list_plugin_distinfo()}
    names = [
        plugin.__name__
        for plugin in config.pluginmanager.get_plugins()
        if isinstance(plugin, types.ModuleType)
        and plugin.__name__.startswith("pytest_kernelpro.")
        and id(plugin) not in by_entry_point
    ]
    # The gate's plugin first: the others' hooks use what it registers.
    names.sort(key=lambda name: name != "pytest_kernelpro.plugin")
    return [arg for name in names for arg in ("-p", name)]


def child_address(item: KernelItem) -> str:
    """The item as the child can find it from any directory: its file's absolute path and
    the node id's part after the file ("/abs/23_Softmax.py::23_Softmax"); the node id
    itself when the item has no file path. Not the node id: a KernelBench problem under
    `--kernelpro-problems` or any file outside the rootdir has one relative to the directory
    it was collected from, which the child, started in the invocation directory, cannot find."""
    path = getattr(item, "path", None)
    nodeid = str(item.nodeid)
    if path is None or "::" not in nodeid:
        return nodeid
    return f"{Path(path).resolve()}::{nodeid.split('::', 1)[1]}"


def child_command(item: KernelItem, session: KernelproSession, json_path: Path) -> list[str]:
    config = session.config
    settings = session.settings
    cmd = [sys.executable, "-m", "pytest", *plugin_arguments(config), child_address(item), "-q"]
    cmd += ["-p", "no:cacheprovider"]
    cmd += ["--rootdir", str(config.rootpath), CHILD_FLAG, f"--kernelpro-json={json_path}"]
    if config.inipath is not None:
        cmd += ["-c", str(config.inipath)]
    for override in config.getoption("override_ini", default=None) or []:
        cmd += ["-o", override]
    if config.pluginmanager.hasplugin("xdist"):
        cmd += ["-n", "0"]
    if settings.check:
        cmd.append("--kernelpro-check")
    if settings.profile:
        cmd.append("--kernelpro-profile")
    for args in config.hook.pytest_kernelpro_isolated_child_args(config=config):
        cmd += args or []
    if settings.save_baseline is not None:  # bootstrapping: the child must not need the file
        cmd.append(f"--kernelpro-save-baseline={json_path.with_suffix('.baseline.yaml')}")
    return cmd


def child_environment(session: KernelproSession) -> dict[str, str]:
    """The parent's environment plus every resolved setting as its KERNELPRO_* variable."""
    settings = session.settings
    env = dict(os.environ)
    # The parent keeps the run in the history, once.
    values = {**settings.resolved, "cpu_threads": settings.cpu_threads or "auto", "history": "off"}
    for setting in SETTINGS:
        if setting.name in ("isolate", "json"):
            continue
        value = values.get(setting.name)
        if value is None:
            env.pop(setting.env_var, None)
        elif isinstance(value, bool):
            env[setting.env_var] = "true" if value else "false"
        else:
            env[setting.env_var] = str(value)
    env.pop("KERNELPRO_ISOLATE", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = {
            "SIGSEGV": " (a segmentation fault: an invalid memory access in native code)",
            "SIGKILL": " (killed: often the kernel out-of-memory killer)",
            "SIGABRT": " (aborted: a failed assertion or a fatal error in native code)",
            "SIGBUS": " (a bus error in native code)",
        }.get(name, "")
        return f"was killed by {name}{hint}"
    return f"exited with status {returncode}"


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-OUTPUT_TAIL_LINES:])


def child_record_for(log_path: Path, nodeid: str, name: str) -> KernelRecord | None:
    """The child's record of the item: by node id, else the one record named `name` (the
    child computes node ids from its own rootdir and arguments)."""
    from pytest_kernelpro.gate.report_read import read_records_log

    if not log_path.exists():
        return None
    try:
        records = read_records_log(log_path).records
    except KernelproError:
        return None
    by_id = [r for r in records if r.nodeid == nodeid]
    named = by_id or [r for r in records if r.name == name]
    return named[0] if len(named) == 1 else None


def run_isolated(item: KernelItem, session: KernelproSession, record: KernelRecord) -> None:
    """Run `item` in a child process and copy its record into `record`; raise on failure."""
    import pytest

    from pytest_kernelpro.run.context import time_limit_setting

    limit_setting = time_limit_setting(session.settings)
    limit = limit_setting.value
    with tempfile.TemporaryDirectory(prefix="kernelpro-isolate-") as tmp:
        json_path = Path(tmp) / "child.json"
        cmd = child_command(item, session, json_path)
        started = time.perf_counter()
        proc, output, killed = run_child(cmd, session, limit)
        timed_out = killed is not None
        released = None if killed is None else wait_released(killed, RELEASE_WAIT_S)
        if not timed_out and proc.returncode != 0:
            # A crashed child (or one its own watchdog ended) may have left a GPU context.
            released = wait_released([proc.pid], RELEASE_WAIT_S)
        wall = time.perf_counter() - started
        child = child_record_for(json_path.with_suffix(".jsonl"), item.nodeid, item.name)
    isolation = {"returncode": proc.returncode, "wall_s": wall, "command": cmd}
    if released is not None:
        isolation["released"] = released
    if child is not None and not timed_out:
        for name in child.__struct_fields__:
            if name not in ("nodeid", "extra"):
                setattr(record, name, getattr(child, name))
        record.extra.update(child.extra)
        record.extra["isolated"] = isolation
        if child.outcome == "skipped":
            pytest.skip(child.message or "skipped in the isolated child")
        if child.outcome != "passed":
            raise KernelproError(child.message or f"{item.name} failed in its isolated process")
        return
    record.extra["isolated"] = isolation
    if timed_out:
        assert limit is not None
        what = (
            f"ran past the item time limit of {limit:g} s "
            f"({limit_setting.source}) plus {STARTUP_ALLOWANCE_S:g} s "
            "for its process to start, and its process was killed"
        )
    else:
        what = f"did not report a result: its process {_describe_exit(proc.returncode)}"
        if proc.returncode == 0:
            what += " without writing its record (os._exit in the kernel, or a plugin exiting)"
    raise KernelproError(
        f"{item.name} {what} (--kernelpro-isolate; the other kernels are not affected). "
        f"Last output of its process:\n{_tail(output or '') or '(none)'}"
    )


def run_child(
    cmd: list[str], session: KernelproSession, limit: float | None
) -> tuple[subprocess.Popen[str], str, list[int] | None]:
    """Run a child pytest (`cmd`) from the session's directory, in a process group of its own
    (a kill takes its children too), within `limit` (None: none) plus its start-up allowance:
    (process, output, pids killed past the limit or None). OSError when it cannot start."""
    proc = subprocess.Popen(
        cmd,
        cwd=str(session.config.invocation_params.dir),
        env=child_environment(session),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=None if limit is None else limit + STARTUP_ALLOWANCE_S)
    except subprocess.TimeoutExpired:
        killed = kill_group(proc)
        output, _ = proc.communicate()
        return proc, output, killed
    return proc, output, None


def kill_group(proc: subprocess.Popen[str]) -> list[int]:
    """SIGKILL the child's process group (it leads its own session); the pids it held."""
    pids = sorted({proc.pid, *group_pids(proc.pid)})
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    return pids


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None (gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()  # the name may hold spaces and parentheses


def group_pids(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (Linux /proc; empty elsewhere)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit():
            fields = _proc_stat(int(entry))
            # fields[0] is the state, fields[2] the process group
            if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    fields = _proc_stat(pid)
    if fields is None:
        if not os.path.exists("/proc"):  # no /proc: ask the kernel
            try:
                os.kill(pid, 0)
            except (ProcessLookupError, PermissionError):
                return False
            return True
        return False
    return fields[0] != "Z"  # a zombie has closed its files: its GPU context is gone


def _gpu_holders(pids: set[int]) -> set[int]:
    """Those of `pids` that NVML lists as holding a compute context on some GPU; empty when
    NVML is not there (nothing more can be known)."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except Exception:  # no NVML, or no driver
        return set()
    holders: set[int] = set()
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            holders |= {int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except Exception:  # NVMLError: not supported, GPU lost
        pass
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return holders & pids


def wait_released(pids: list[int], timeout_s: float) -> dict[str, object]:
    """Wait (at most `timeout_s`) until none of `pids` runs and none holds a GPU context."""
    started = time.perf_counter()
    wanted = set(pids)
    while True:
        alive = {pid for pid in wanted if _alive(pid)}
        holders = set() if alive else _gpu_holders(wanted)
        if not alive and not holders:
            break
        if time.perf_counter() - started >= timeout_s:
            break
        time.sleep(0.1)
    return {
        "pids": sorted(wanted),
        "waited_s": round(time.perf_counter() - started, 3),
        "still_alive": sorted(alive),
        "still_on_gpu": sorted(holders),
    }
