"""Several expansions in flight: the search loop for evaluators that run candidates elsewhere.

The one-at-a-time loop (`engine.SearchAlgorithm._loop`) waits for every evaluation before it
selects again. With N workers (GPUs of a Dask cluster, `optimize/dask/dask_evaluator.py`) that leaves
N-1 idle, so this loop keeps up to `in_flight` evaluations running:

- **select, generate, submit** while fewer than `in_flight` are running and the budget has
  room. A submitted candidate is a *pending child* of its node: it counts against the
  node's widening room (`SearchNode.pending`), and every node on its path gets one *virtual
  visit* with the failure reward (virtual loss), so UCT's next walk sees that path as
  visited and worse and goes elsewhere instead of sending every worker down the same path.
  A subtree whose every node waits for its children is closed until a result comes back
  (`MCTS.decide`); a node never becomes a dead end while one of its children is pending.
- **results in the order they arrive**: the virtual visits are taken back, the child is
  attached with its real reward and backpropagated, the budget counts it and the trajectory
  gets its line. Node ids follow the order of completion, so every parent precedes its
  children in the file, and `restore`/`--kernelpro-resume`/`kernelpro show` rebuild the same
  tree and statistics. Each node's `metrics["in_flight"]` says when it was submitted
  (`submitted`: the n-th candidate sent out) and how many ran beside it.
- **the budget across workers**: an evaluation budget counts running evaluations as spent,
  so no more than the budget are ever started; when the time or API budget ends, no new
  candidate is generated, candidates not started yet are dropped (like the candidates the
  one-at-a-time loop drops past its budget), and those running finish and are recorded.

Threads: the candidates' evaluator chains (`evaluate`) run on `in_flight` threads of this
process; everything else (selection, generation's bookkeeping, the tree, the trajectory)
stays on the calling thread. One lock serialises the two: a chain holds it except while it
waits for remote work (`released()`, used by `DaskEvaluator`), and the loop holds it except
while it waits for a result or the generator runs. So wrappers written for the sequential
loop (progress lines, timers, the profiling evaluator) never run at the same time as each
other or as a change to the tree.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search.budget import BudgetTracker
    from pytest_kernelpro.optimize.search.engine import SearchAlgorithm
    from pytest_kernelpro.optimize.search.interfaces import (
        Candidate,
        CandidateGenerator,
        Evaluation,
        Evaluator,
    )
    from pytest_kernelpro.optimize.search.tree import SearchNode

_held = threading.local()  # the loop's lock, on the threads that run evaluator chains


@contextmanager
def released() -> Iterator[None]:
    """Let go of the search loop's lock while waiting for work done elsewhere (a remote
    evaluation); a no-op outside `run_in_flight`."""
    lock: threading.RLock | None = getattr(_held, "lock", None)
    if lock is None:
        yield
        return
    lock.release()
    try:
        yield
    finally:
        lock.acquire()


@dataclass
class _Pending:
    """A candidate sent out and not back yet."""

    node: SearchNode
    candidate: Candidate
    future: Future[Evaluation]
    submitted: int  # the n-th candidate sent out in this session
    virtual_loss: float
    peak: int  # most candidates in flight while this one was


def run_in_flight(
    algorithm: SearchAlgorithm,
    generator: CandidateGenerator,
    evaluator: Evaluator,
    tracker: BudgetTracker,
    writer: Any,
    *,
    in_flight: int,
    poll_s: float = 0.5,
) -> str:
    """The search loop with up to `in_flight` evaluations running (module doc); returns the
    stop reason, like `SearchAlgorithm._loop`."""
    if in_flight < 1:
        raise KernelproError(f"in_flight={in_flight!r}: at least one evaluation must run")
    lock = threading.RLock()
    pending: dict[Future[Evaluation], _Pending] = {}
    sent = 0
    stop: str | None = None
    budget = tracker.budget
    virtual_loss = algorithm.reward_config.failure

    def run_chain(candidate: Candidate) -> Evaluation:
        _held.lock = lock
        try:
            with lock:
                return algorithm.simulate(evaluator, candidate)
        finally:
            _held.lock = None

    def add_virtual(entry: _Pending, sign: int) -> None:
        for node in entry.node.path():
            node.visits += sign
            node.virtual += sign
            # Reset when the last one is back, so no rounding is left behind.
            node.virtual_reward = (
                node.virtual_reward + sign * entry.virtual_loss if node.virtual else 0.0
            )
        entry.node.pending += sign
        algorithm.in_flight += sign

    def finish(future: Future[Evaluation]) -> None:
        entry = pending.pop(future)
        add_virtual(entry, -1)
        evaluation = future.result()  # simulate() raises only for KernelproError / Ctrl-C
        evaluation.metrics["in_flight"] = {
            "submitted": entry.submitted,
            "alongside": entry.peak - 1,
        }
        child = algorithm.expand(entry.node, entry.candidate, evaluation)
        algorithm.backpropagate(child)
        tracker.record_evaluation()
        child.elapsed_s = tracker.seconds
        if writer is not None:
            writer.append_node(child)

    def drop_unstarted() -> None:
        for future in list(pending):
            if future.cancel():
                add_virtual(pending.pop(future), -1)

    def wait_for_one(timeout: float | None) -> None:
        with released_lock(lock):
            done, _ = wait(list(pending), timeout=timeout, return_when=FIRST_COMPLETED)
        for future in sorted(done, key=lambda f: pending[f].submitted):
            finish(future)

    pool = ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="kp-inflight")
    lock.acquire()
    try:
        while True:
            if stop is None:
                stop = tracker.exhausted()
            if stop is None and budget.max_evaluations is not None:
                if tracker.evaluations + len(pending) >= budget.max_evaluations:
                    stop = "evaluation budget"  # replaced by the tracker's reason at the end
            if stop is not None:
                if tracker.exhausted(("seconds",)):
                    drop_unstarted()
                if not pending:
                    return tracker.exhausted() or stop
                wait_for_one(poll_s)
                continue
            if len(pending) >= in_flight:
                wait_for_one(poll_s)
                continue
            node = algorithm.select()
            if pending and algorithm.room(node) <= 0:
                wait_for_one(poll_s)  # only a forced ROOT: wait for a result instead
                continue
            slots = algorithm.slots(node)
            at_node = getattr(generator, "at_node", None)
            if callable(at_node):
                at_node(node.id)
            try:
                with released_lock(lock):
                    candidates = list(
                        generator.generate(
                            node.child_mode, node.candidate, node.evaluation, max_candidates=slots
                        )
                    )
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # e.g. an API outage: finish what runs, keep it all
                import warnings

                from pytest_kernelpro.errors import KernelproWarning

                warnings.warn(
                    f"kernelpro search stopped: the candidate generator raised "
                    f"{type(exc).__name__}: {exc}. The trajectory can be resumed.",
                    KernelproWarning,
                    stacklevel=3,
                )
                stop = f"generator raised {type(exc).__name__}: {exc}"
                continue
            tracker.add_cost(sum(c.cost_usd for c in candidates))
            if not candidates:
                stop = f"generator returned no candidates for mode {node.child_mode!r}"
                continue
            taken = candidates[:slots]
            if budget.max_evaluations is not None:
                left = budget.max_evaluations - tracker.evaluations - len(pending)
                taken = taken[: max(0, left)]
            if tracker.exhausted(("evaluations", "seconds")):
                continue  # the wall time ended while the generator ran
            prepare = getattr(evaluator, "prepare", None)
            if callable(prepare):
                prepare(taken)
            for candidate in taken:
                sent += 1
                future = pool.submit(run_chain, candidate)
                entry = _Pending(node, candidate, future, sent, virtual_loss, 0)
                pending[future] = entry
                add_virtual(entry, +1)
            for entry in pending.values():
                entry.peak = max(entry.peak, len(pending))
    except BaseException:
        for future in list(pending):
            future.cancel()
        cancel = getattr(evaluator, "cancel", None)
        if callable(cancel):
            cancel()
        raise
    finally:
        lock.release()
        pool.shutdown(wait=False, cancel_futures=True)


@contextmanager
def released_lock(lock: threading.RLock) -> Iterator[None]:
    """Release `lock` (held once by this thread) for the block."""
    lock.release()
    try:
        yield
    finally:
        lock.acquire()
