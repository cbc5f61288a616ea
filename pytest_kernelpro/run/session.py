"""The one session object (settings, ceilings per device, the baseline, the records) and what
it writes at the end: the JSON report, the baseline, the run history, the terminal table."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.record import KernelRecord, decode_record

if TYPE_CHECKING:
    import pytest

    from pytest_kernelpro.config import KernelproConfig
    from pytest_kernelpro.gate.baseline import Baseline
    from pytest_kernelpro.gate.format import Note
    from pytest_kernelpro.gate.report import RecordsLog
    from pytest_kernelpro.measure.ceilings import Ceilings
    from pytest_kernelpro.measure.devices import DeviceSpec
    from pytest_kernelpro.problem import Problem
    from pytest_kernelpro.run.context import Profiling


# TestReport attribute: the record's JSON text (`record.encode_record`), which survives xdist's
# serialization and any plugin's that writes reports out.
REPORT_ATTR = "kernelpro_record"


@dataclass
class DeviceChoice:
    device: str | None  # "cpu", "cuda", or None when the item must be skipped
    skip_reason: str | None = None
    fail: bool = False  # --kernelpro-require-gpu: not running on the GPU is a failure


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@dataclass(eq=False)  # hashable by identity: pluggy registers it as a plugin
class KernelproSession:
    """Holds what every kernel item of one pytest session shares."""

    settings: KernelproConfig
    config: pytest.Config
    records: list[KernelRecord] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    _ceilings: dict[str, Ceilings] = field(default_factory=dict)
    _specs: dict[str, DeviceSpec | None] = field(default_factory=dict)
    _reprobed: set[str] = field(default_factory=set)  # devices whose ceilings were re-probed
    _baseline: Baseline | None = None
    _baseline_error: KernelproError | None = None
    _baseline_loaded: bool = False
    cuda_poisoned_by: str | None = None  # first item whose CUDA error broke the context
    profiling: Profiling = field(init=False)  # the profile stage's setup (builds, budgets)
    notes: list[str | Note] = field(default_factory=list)  # lines for the terminal summary
    history_path: Path | None = None  # this run's file in the run history, once written
    records_log: RecordsLog | None = None  # every finished record, appended as it finishes
    records_log_started: bool = False  # started once, when the first kernel item is known
    # Requested writes that failed ("the JSON report to PATH: [Errno 28] No space left on
    # device"): each fails the session (pytest_sessionfinish) and is said in red.
    write_failures: list[str] = field(default_factory=list)
    json_written: bool = False  # the JSON report of this session is on disk
    baseline_written: bool = False  # the requested baseline is on disk
    collected: list[str] | None = None  # nodeids of the kernel items collected (not xdist)
    # Why this xdist worker has no GPU of its own (`run/workers.py`), else None: a kernel
    # item that would be timed on a GPU here fails with it.
    gpu_shared_by_workers: str | None = None
    # Fixed for the session, read once here (at configure); the hooks, the items and the
    # session's finish read these.
    records_path: Path = field(init=False)
    artifacts_dir: Path = field(init=False)
    time_budget_s: dict[str, float] = field(init=False)
    is_xdist_worker: bool = field(init=False)
    _made: dict[str, tuple[tuple[int, int], Any]] = field(default_factory=dict)  # `_once`

    def __post_init__(self) -> None:
        from pytest_kernelpro.run.context import Profiling

        self.profiling = Profiling.for_settings(self.settings)
        settings = self.settings
        self.records_path, self.artifacts_dir = settings.records_path, settings.artifacts_dir
        self.time_budget_s = {kind: settings.budget_for(kind) for kind in ("cpu", "cuda")}
        self.is_xdist_worker = hasattr(self.config, "workerinput")

    def _once(self, name: str, make: Callable[[], Any]) -> Any:
        """`make()` read once for the JSON report and the terminal both, and again only after
        a record or a note was added."""
        key = (len(self.records), len(self.notes))
        held = self._made.get(name)
        if held is None or held[0] != key:
            held = self._made[name] = (key, make())
        return held[1]

    def conditions(self) -> list[Note]:
        """The session's conditions (`gate.render_session.session_conditions`)."""
        from pytest_kernelpro.gate.render_session import session_conditions

        return self._once(
            "conditions", lambda: session_conditions(self.settings, self.records, self.notes)
        )

    def coverage(self) -> tuple[list[str], list[str]] | None:
        """Under --kernelpro-check, `gate.baseline.unmatched` of its baseline; else None."""
        baseline = self._baseline
        if not self.settings.check or baseline is None:
            return None
        from pytest_kernelpro.gate.baseline import unmatched

        return self._once("coverage", lambda: unmatched(baseline, self.records))

    def progress(self, line: str) -> None:
        """Say on the terminal that a silent one-time step (ceilings) is starting."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or self.is_xdist_worker:
            return
        reporter.ensure_newline()
        reporter.write_line(line)

    # -- devices ---------------------------------------------------------------------------
    def choose_device(self, problem: Problem) -> DeviceChoice:
        choice = self._choose_device(problem)
        if not self.settings.require_gpu or problem.device_preference == "cpu":
            return choice
        if choice.device is not None and choice.device.startswith("cuda"):
            return choice
        # A GPU runner where kernels silently skip or fall back to the CPU gates nothing.
        why = choice.skip_reason or (
            "it would run on the CPU: no CUDA GPU is visible"
            if self.settings.device != "cpu"
            else f"the device setting is 'cpu' ({self.settings.sources.get('device')})"
        )
        return DeviceChoice(
            None,
            f"{problem.display_name} must run on a CUDA GPU (--kernelpro-require-gpu, "
            f"{self.settings.sources.get('require_gpu')}), but {why}. Fix the runner's GPU "
            "(nvidia-smi, torch.cuda.is_available()), or mark CPU-only kernels device='cpu'",
            fail=True,
        )

    def _choose_device(self, problem: Problem) -> DeviceChoice:
        wanted = self.settings.device
        preference = problem.device_preference
        has_cuda = cuda_available()
        if preference == "cpu" or wanted == "cpu":
            if preference == "cuda":
                return DeviceChoice(
                    None,
                    f"{problem.display_name} is a {problem.language} kernel that needs a CUDA GPU, "
                    f"but the device setting is 'cpu' ({self.settings.sources.get('device')})",
                )
            return DeviceChoice("cpu")
        if has_cuda:
            return DeviceChoice(wanted if wanted.startswith("cuda") else "cuda")
        if preference == "cuda" or wanted.startswith("cuda"):
            return DeviceChoice(
                None,
                f"needs a CUDA GPU ({problem.language} kernel) and none is visible "
                "(torch.cuda.is_available() is False); run on a GPU runner",
            )
        return DeviceChoice("cpu")

    # -- ceilings --------------------------------------------------------------------------
    def ceilings_for(self, device: str) -> Ceilings:
        """Measured once per machine and cached; a ceilings file from settings wins."""
        from pytest_kernelpro.measure.ceilings import Ceilings, cached_ceilings, default_cache_dir

        if device in self._ceilings:
            return self._ceilings[device]
        if self.settings.ceilings_path is not None:
            path = self.settings.ceilings_path
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                ceilings = Ceilings.from_dict(data)
            except (OSError, ValueError, KeyError, TypeError, KernelproError) as exc:
                raise KernelproError(
                    f"ceilings file {path} ({self.settings.sources.get('ceilings')}) is unreadable: "
                    f"{exc}; write it with `kernelpro calibrate --out {path}` or drop the setting"
                ) from exc
        else:
            spec = self.spec_for(device)
            found = cached_ceilings(device, default_cache_dir(), spec=spec)
            if found is None:  # none cached, or measured under load: the probe's to decide
                from pytest_kernelpro.measure.ceiling_probe import load_or_measure_ceilings

                found = load_or_measure_ceilings(
                    device, default_cache_dir(), spec=spec, progress=self.progress
                )
            ceilings = found
            if ceilings.details.get("not_cached"):
                self.notes.append(
                    f"ceilings of {ceilings.device}: {ceilings.details['not_cached']}; the "
                    "% of roofline is only as good as they are (`kernelpro calibrate` on a "
                    "quiet machine)"
                )
        self._ceilings[device] = ceilings
        return ceilings

    def reprobe_ceilings(self, device: str, why: str) -> Ceilings:
        """The device's ceilings re-probed once per session (a kernel exceeded them): on the
        CPU the best of the old and a new probe, which makes them trusted; GPU ceilings and a
        ceilings file from settings are returned as they are."""
        from pytest_kernelpro.measure.ceiling_probe import reprobe, reprobe_summary
        from pytest_kernelpro.measure.ceilings import default_cache_dir

        ceilings = self.ceilings_for(device)
        if (
            ceilings.device_type != "cpu"
            or device in self._reprobed
            or self.settings.ceilings_path is not None
        ):
            return ceilings
        self._reprobed.add(device)
        self.progress(f"kernelpro: re-probing the ceilings of {ceilings.device} ({why})")
        ceilings = reprobe(ceilings, device, default_cache_dir(), why=why)
        self._ceilings[device] = ceilings
        self.notes.append(f"ceilings of {ceilings.device} {reprobe_summary(ceilings)}")
        return ceilings

    def spec_for(self, device: str) -> DeviceSpec | None:
        """The device table entry of a GPU (hook-provided specs win); None on CPU."""
        if not device.startswith("cuda"):
            return None
        from pytest_kernelpro.measure.devices import find_device_spec

        if device not in self._specs:
            import torch

            extra = [
                s
                for specs in self.config.hook.pytest_kernelpro_device_specs()
                for s in (specs or [])
            ]
            self._specs[device] = find_device_spec(
                torch.cuda.get_device_name(torch.device(device)), extra
            )
        return self._specs[device]

    def op_cost_hook(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        return self.config.hook.pytest_kernelpro_op_cost(op=op, args=args, kwargs=kwargs, out=out)

    # -- baseline --------------------------------------------------------------------------
    def baseline(self) -> Baseline | None:
        """The baseline for --kernelpro-check; raises the load error for every item."""
        if not self._baseline_loaded:
            self._baseline_loaded = True
            from pytest_kernelpro.gate.baseline import load_baseline

            path = self.settings.baseline_path
            if not path.exists() and self.settings.save_baseline is not None:
                self._baseline = None  # bootstrapping: every kernel is new
            else:
                try:
                    self._baseline = load_baseline(path)
                except KernelproError as exc:
                    self._baseline_error = exc
        if self._baseline_error is not None:
            raise self._baseline_error
        return self._baseline

    # -- records ---------------------------------------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Gather records on the controller (also those sent by xdist workers).

        A hook on the registered session object, because the report carries no config.
        """
        data = getattr(report, REPORT_ATTR, None)
        if data is None or self.is_xdist_worker:
            return
        self.add_record(decode_record(data, source=f"the record of {report.nodeid}"))

    def add_record(self, record: KernelRecord) -> None:
        self.records.append(record)
        if not (self.records_log_started or self.is_xdist_worker):  # xdist: the first record
            self.start_records_log()
        if self.records_log is not None:
            try:
                self.records_log.record(record)
            except OSError as exc:
                self._log_failed(exc)
        self.config.hook.pytest_kernelpro_record(record=record)

    def write_outputs(self) -> None:
        """Write the JSON report and, when asked, the baseline and the history; never raise into
        pytest. A write that fails is noted (`write_failed`), never said to be written."""
        from pytest_kernelpro.fileio import atomic_write_json
        from pytest_kernelpro.gate.report import build_report

        settings = self.settings
        saving = settings.save_baseline is not None and not settings.correctness_only
        measured = [r for r in self.records if r.outcome == "passed" and r.timing]
        if saving:
            from pytest_kernelpro.gate.baseline_save import too_noisy_note

            # Said when it is saved: a baseline this noisy would make every later check unresolved.
            noisy = too_noisy_note(measured)
            if noisy is not None:
                self.notes.append(noisy)
        report = build_report(self.records, meta=self.report_meta())
        try:
            atomic_write_json(settings.json_path, report)  # a reader never sees half a file
            self.json_written = True
        except OSError as exc:
            self.write_failed("JSON report", settings.json_path, exc)
        try:
            _ignore_artifacts_dir(self.artifacts_dir)
        except OSError as exc:
            self.write_failed("artifacts .gitignore", self.artifacts_dir / ".gitignore", exc)
        if settings.history_dir is not None:
            from pytest_kernelpro.gate.report import save_run

            try:
                self.history_path = save_run(settings.history_dir, report)
            except OSError as exc:
                self.write_failed(
                    f"run history ({settings.sources.get('history')})", settings.history_dir, exc
                )
        if saving:
            from pytest_kernelpro.gate.baseline_save import save_baseline

            try:
                save_baseline(settings.save_baseline, measured)
                self.baseline_written = True
            except OSError as exc:
                self.write_failed("baseline", settings.save_baseline, exc)
            except KernelproError as exc:
                warnings.warn(
                    f"kernelpro: could not save the baseline to {settings.save_baseline}: {exc}",
                    KernelproWarning,
                    stacklevel=1,
                )
                self.write_failed("baseline", settings.save_baseline, exc)

    def stop(self) -> None:
        """End the build capture (the session's last act, at pytest_unconfigure)."""
        if self.profiling.capture is not None:
            self.profiling.capture.stop()

    # -- records log -----------------------------------------------------------------------
    def start_records_log(self) -> None:
        """Start this session's records log (controller only; workers send their records),
        once a kernel item is known to run: a session that runs none (`--co`, every kernel
        deselected, a project without kernels) writes no kernelpro file."""
        from pytest_kernelpro.gate.report import RecordsLog

        self.records_log_started = True

        log = RecordsLog(self.records_path)
        try:
            log.start(list(self.config.invocation_params.args))
        except OSError as exc:
            self._log_failed(exc)
            return
        self.records_log = log

    def log_collected(self, nodeids: list[str]) -> None:
        self.collected = list(nodeids)
        if nodeids and not self.records_log_started:
            self.start_records_log()
        if self.records_log is not None:
            try:
                self.records_log.collected(nodeids)
            except OSError as exc:
                self._log_failed(exc)

    def log_finished(self, exitstatus: int) -> None:
        if self.records_log is not None:
            try:
                self.records_log.finished(exitstatus)
            except OSError as exc:
                self._log_failed(exc)

    def missing_records(self) -> list[str]:
        """Collected kernel items that produced no record (known only without xdist)."""
        if self.collected is None:
            return []
        done = {r.nodeid for r in self.records}
        return [n for n in self.collected if n not in done]

    def _log_failed(self, exc: OSError) -> None:
        # A records log that cannot be written fails the session (write_failures); the
        # records are kept in memory, so the JSON report can still be written.
        self.records_log = None
        self.write_failed("records log", self.records_path, exc)

    def write_failed(self, what: str, path: Path | str, exc: BaseException) -> None:
        """Note a requested write that failed: the session fails, naming `path` and the error."""
        detail = f"{exc.strerror} (errno {exc.errno})" if isinstance(exc, OSError) else str(exc)
        if isinstance(exc, OSError) and exc.filename and str(exc.filename) != str(path):
            detail += f" at {exc.filename}"
        self.write_failures.append(f"could not write the {what} to {path}: {detail}")

    def report_meta(self) -> dict[str, Any]:
        import platform

        from pytest_kernelpro.gate.baseline import detect_commit
        from pytest_kernelpro.gate.report import machine_name
        from pytest_kernelpro.gate.verdict import DEFAULT_CPU_THRESHOLD, DEFAULT_GPU_THRESHOLD
        from pytest_kernelpro.gate.verdict_basis import (
            BUSY_MEMORY_TOLERANCE,
            BUSY_TOLERANCE,
            PROCESS_TOLERANCE,
        )

        meta: dict[str, Any] = {
            "python": platform.python_version(),
            "machine": machine_name(),
            "wall_s": time.perf_counter() - self.started,
            "check": self.settings.check,
            # Nothing timed: `kernelpro compare` and `history` pass the run over.
            "correctness_only": self.settings.correctness_only,
            "threshold": self.settings.threshold,  # None: the per-device defaults below
            "default_thresholds": {"cuda": DEFAULT_GPU_THRESHOLD, "cpu": DEFAULT_CPU_THRESHOLD},
            # The least tolerance of a CPU comparison whatever the threshold: what --help and
            # the README state beside the 5% threshold.
            "cpu_tolerance_floor": {
                "quiet": PROCESS_TOLERANCE,
                "busy": BUSY_TOLERANCE,
                "busy_memory_anchored": BUSY_MEMORY_TOLERANCE,
            },
            "records_log": str(self.records_path),
            "baseline": str(self.settings.baseline_path),
            "commit": detect_commit(self.settings.rootpath),
            "baseline_commit": self._baseline.commit if self._baseline is not None else None,
            "notes": summary_notes(self, full=True),  # the terminal says them short
        }
        try:
            import torch

            meta["torch"] = torch.__version__
        except ImportError:
            meta["torch"] = None
        devices = sorted({r.device for r in self.records if r.device})
        meta["devices"] = devices
        coverage = self.coverage()
        if coverage is not None:
            left, without = coverage
            meta["baseline_entries_without_kernel"] = left
            meta["kernels_without_baseline_entry"] = without
        return meta


def start_session(config: pytest.Config) -> KernelproSession:
    """The session of one pytest run, set up from its config (what `pytest_configure` does)."""
    import pytest

    from pytest_kernelpro.config import KernelproConfig

    settings = KernelproConfig.from_pytest_config(config)
    workerinput = getattr(config, "workerinput", None)
    gpu_shared_by_workers = None
    if workerinput is not None:
        from pytest_kernelpro.run.workers import assign_worker_gpu

        try:
            pinned = assign_worker_gpu(
                workerinput["workerid"], int(workerinput.get("workercount", 1))
            )
        except ValueError as exc:
            raise pytest.UsageError(f"kernelpro: {exc}") from None
        gpu_shared_by_workers = pinned.shared
    if settings.problems is not None:
        if not settings.problems.is_dir():
            raise pytest.UsageError(
                f"kernelpro: problems directory {settings.problems} "
                f"({settings.sources['problems']}) does not exist; pass an existing DIR"
            )
        if not any(is_within(settings.problems, Path(a.split("::")[0])) for a in config.args):
            config.args.append(str(settings.problems))
    session = KernelproSession(
        settings=settings,
        config=config,
        gpu_shared_by_workers=gpu_shared_by_workers,
    )
    # A run that gates nothing (correctness only, --co) needs no baseline; xdist workers
    # start only after the controller loaded it.
    gates = settings.check and not settings.correctness_only
    if gates and workerinput is None and not config.option.collectonly:
        load_baseline_before_any_item(session)
    # The builds are looked up by the profiler alone, which profiles CUDA devices only: a
    # machine without one records none. Extra build flags (-lineinfo, ptxas -v) only when
    # profiling was asked for.
    if (settings.profile or settings.check) and cuda_available():
        from pytest_kernelpro.run.profile_stage import SessionCapture

        capture = SessionCapture(extra_flags=settings.profile)
        capture.start()
        session.profiling.capture = capture
    return session


def load_baseline_before_any_item(session: KernelproSession) -> None:
    """--kernelpro-check: a missing or corrupt baseline is a usage error (exit 4, one line)
    before any kernel is measured, not an error of every item after all were timed."""
    import pytest

    try:
        session.baseline()
    except KernelproError as exc:
        raise pytest.UsageError(f"kernelpro: --kernelpro-check cannot run: {exc}") from None


def is_within(child: Path, parent: Path) -> bool:
    return child.resolve().is_relative_to(parent.resolve())


# -- end-of-session outputs: the artifacts folder's .gitignore, the terminal table --


def _ignore_artifacts_dir(path: Any) -> None:
    gitignore = path / ".gitignore"
    if path.is_dir() and not gitignore.exists():
        gitignore.write_text("*\n", encoding="utf-8")


def baseline_coverage_lines(kp: KernelproSession, full: bool) -> list[str]:
    """What --kernelpro-check could not compare (`full`: every name, as with -v)."""
    coverage = kp.coverage()
    if coverage is None or not any(coverage):  # every entry matched: nothing to say
        return []
    from pytest_kernelpro.gate.condition_notes import coverage_lines

    return coverage_lines(*coverage, verbose=full)


def terminal_summary(kp: KernelproSession, terminalreporter: Any) -> None:
    from pytest_kernelpro.gate.render_session import (
        missing_records_line,
        output_lines,
        render_terminal_table,
    )

    writer = getattr(terminalreporter, "_tw", None)
    columns = table_width(writer)
    color = bool(getattr(writer, "hasmarkup", False))
    settings = kp.settings
    full = verbose(kp)  # read once: the table, the notes and the outputs' lines all follow it
    terminalreporter.write_sep("=", "kernelpro")
    terminalreporter.write_line(
        render_terminal_table(
            kp.records, width=columns, color=color, sort=settings.sort, verbose=full
        ).rstrip("\n")
    )
    for title, lines in plugin_sections(kp.records):
        terminalreporter.write_sep("=", title)
        for line in lines:
            terminalreporter.write_line(line)
    for line in baseline_coverage_lines(kp, full):
        terminalreporter.write_line(line, yellow=True)
    for line in summary_notes(kp, full=full):
        terminalreporter.write_line(f"kernelpro: {line}")
    from pytest_kernelpro.gate.render_session import session_line

    nothing = session_line(
        kp.records, check=settings.check, allow_incomparable=settings.allow_incomparable
    )
    if nothing is not None:
        terminalreporter.write_line(nothing, red=True)
    missing = kp.missing_records()
    if missing:
        terminalreporter.write_line(missing_records_line(missing, check=settings.check), red=True)
    # Only files that are on disk are named as written; each failed write in red.
    for line in output_lines(
        json_path=settings.json_path if kp.json_written else None,
        records_path=kp.records_path if kp.records_log is not None else None,
        history_path=kp.history_path,
        baseline_path=settings.save_baseline if kp.baseline_written else None,
        verbose=full,
    ):
        terminalreporter.write_line(line)
    for failure in kp.write_failures:
        terminalreporter.write_line(f"kernelpro: FAILED: {failure}", red=True)


def plugin_sections(records: list[KernelRecord]) -> list[tuple[str, list[str]]]:
    """Other plugins' terminal sections (`record.sections`), one per title, in order."""
    sections: dict[str, list[str]] = {}
    for record in records:
        for section in record.sections:
            sections.setdefault(section.title, []).extend(section.terminal_lines)
    return [(title, lines) for title, lines in sections.items() if lines]


def table_width(writer: Any) -> int | None:
    """The terminal's columns, or None where pytest writes to no terminal (a CI log, a pipe,
    a file: gate/render_session.py's "Tables")."""
    if writer is None:
        return None
    stream = getattr(writer, "_file", None)
    isatty = getattr(stream, "isatty", None)
    if stream is not None and not (callable(isatty) and isatty()):
        return None
    return int(getattr(writer, "fullwidth", 120))


def summary_notes(kp: KernelproSession, *, full: bool | None = None) -> list[str]:
    """The session's conditions: one short line each, the full text with -v (`full`: decide
    without the verbosity, for the JSON report)."""
    from pytest_kernelpro.gate.render_session import note_lines

    return note_lines(kp.conditions(), verbose=verbose(kp) if full is None else full)


def verbose(kp: KernelproSession) -> bool:
    """pytest ran with -v: full notes and whole kernel names."""
    return int(getattr(kp.config.option, "verbose", 0) or 0) > 0
