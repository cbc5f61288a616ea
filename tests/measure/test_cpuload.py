"""measure/timing/cpu_load.py, the CPU's load: when a CPU interval counts as oversubscribed, and the thread policy."""

from __future__ import annotations

import pytest

from pytest_kernelpro.measure.timing.cpu_load import CpuLoad, CpuLoadMonitor, policy_threads


def load(threads: int, others: float | None, cores: int = 2, cpus: int = 2) -> CpuLoad:
    return CpuLoad(cores=cores, cpus=cpus, threads=threads, others_cores=others,
                   loadavg_1m=1.0, runnable_threads=2, wall_s=1.0)  # fmt: skip


@pytest.mark.parametrize(
    ("threads", "others", "cores", "busy"),
    [
        (1, 0.0, 2, False),
        (1, 0.4, 2, False),  # a core left for the thread, the neighbour under a quarter
        (1, 1.0, 2, True),  # a core left for the thread, but half the machine busy
        (1, 1.5, 2, True),  # half a core for one thread
        (1, 3.0, 16, False),  # a big machine: 3 of 16 cores busy elsewhere
        (2, 0.1, 2, False),  # background noise within the slack
        (2, 0.5, 2, True),
        (4, 0.0, 2, True),  # more threads than cores, whatever else runs
        (1, None, 2, False),  # no /proc/stat: only the thread count decides
    ],
)
def test_oversubscription_rule(threads: int, others: float | None, cores: int, busy: bool) -> None:
    state = load(threads, others, cores=cores, cpus=cores)
    assert state.oversubscribed is busy
    assert bool(state.reasons()) is busy


def test_reasons_and_description_name_the_numbers() -> None:
    state = load(4, 1.5)
    reasons = state.reasons()
    assert reasons[0].startswith("4 threads on 2 available core(s)")
    assert reasons[1] == "other processes used 1.5 of 2 core(s) while 4 thread(s) were timed"
    assert state.describe().endswith("load average 1.0 on 2 CPU(s); 2 runnable thread(s)")
    assert CpuLoad.from_dict(state.to_dict()) == state


@pytest.mark.parametrize(("others", "said"), [(2.2, "all 2"), (2.0, "all 2"), (1.96, "all 2"),
                                              (1.9, "1.9 of 2")])  # fmt: skip
def test_other_processes_use_is_capped_at_the_machine(others: float, said: str) -> None:
    """Tick rounding can make the measured use exceed the machine; it is said as "all"."""
    state = load(1, others)
    assert state.reasons() == [f"other processes used {said} core(s) while 1 thread(s) were timed"]
    assert state.free_cores == pytest.approx(max(0.0, 2 - min(others, 2.0)))


def test_monitor_measures_an_interval() -> None:
    state = CpuLoadMonitor(1).stop()
    assert state.threads == 1
    assert state.cores >= 1
    assert state.others_cores is None or 0 <= state.others_cores <= state.cpus


def test_thread_policy_is_one_thread_unless_asked() -> None:
    assert policy_threads(0) == 1
    assert policy_threads(None) == 1
    assert policy_threads(3) == 3
