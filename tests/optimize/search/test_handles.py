"""Checked outputs by handle (`optimize/sandbox/handles.py`): round trips, the read-only
guarantee, what the session refuses, and that no descriptor or /dev/shm entry is left.

Plain unit tests in this process: a socket pair stands for the worker's and the judge's
channels. The real path (sandboxed worker, session, judge) is test_handle_attacks.py.
"""

from __future__ import annotations

import fcntl
import gc
import json
import mmap
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.sandbox import handles
from pytest_kernelpro.optimize.sandbox.handles import (
    HandleChannels,
    HandleError,
    receive_outputs,
    send_output,
    send_outputs,
)

torch = pytest.importorskip("torch")


def memfds() -> list[str]:
    """This process's open memfd descriptors (their /proc links)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("/memfd:"):
            found.append(link)
    return found


def shm_entries() -> set[str]:
    """/dev/shm's entries, without Python multiprocessing's named semaphores (`sem.mp-*`):
    tests running beside these on the other xdist worker (the Dask cluster, process pools)
    make and remove those; the evaluation path makes none (its handles have no name)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm") if not name.startswith("sem.mp-")}


def mapped_outputs() -> int:
    """Mappings of handed-over outputs' memfds in this process."""
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        return sum("/memfd:kernelpro-trial" in line for line in maps)


def session(tmp_path: Path, limit: int = 2**30) -> tuple[HandleChannels, socket.socket]:
    """A session's channels with one open for `tmp_path`; the worker's end."""
    channels = HandleChannels(limit)
    ours, theirs = handles.socket_pair()
    channels.open(tmp_path, ours)
    return channels, theirs


def hand_over(tmp_path: Path, outputs: dict[str, list[object]]) -> handles.Received:
    channels, worker = session(tmp_path)
    for name, leaves in outputs.items():
        send_output(torch, name, list(leaves), channel=worker)  # a list it sends is emptied
    worker.close()  # the worker exited
    return channels.finish(tmp_path)


def to_judge(received: handles.Received) -> dict[str, list[object]]:
    ours, judge_end = handles.socket_pair()
    try:
        send_outputs(ours, received)
        return receive_outputs(torch, channel=judge_end)
    finally:
        ours.close()
        judge_end.close()


def raw_send(end: socket.socket, line: dict[str, object], fds: list[int]) -> None:
    socket.send_fds(end, [json.dumps(line).encode()], fds)


def test_every_leaf_crosses_worker_session_and_judge(tmp_path: Path) -> None:
    x = torch.randn(3, 5)
    leaves = [
        x,
        x.t(),  # not contiguous: handed over in its logical order
        torch.tensor([True, False, True]),
        torch.arange(6, dtype=torch.bfloat16).view(2, 3),
        torch.empty(0, 4),
        7,
        None,
        "a string",  # anything but a number crosses as its repr, as the judge compares it
    ]
    received = hand_over(tmp_path, {"trial-1": leaves})
    assert received.refused is None
    assert received.nbytes == 15 * 4 * 2 + 3 + 6 * 2
    judged = to_judge(received)["trial-1"]
    for got, sent in zip(judged, leaves, strict=True):
        if isinstance(sent, torch.Tensor):
            assert got.dtype == sent.dtype
            assert got.shape == sent.shape
            assert torch.equal(got, sent)
        else:
            assert got == (repr(sent) if isinstance(sent, str) else sent)
    received.close()


def test_a_handed_over_output_cannot_be_changed_by_anyone(tmp_path: Path) -> None:
    """The session's memfd is sealed: no write, no writable shared mapping, no resize; the
    judge's mapping is private, so even its own writes reach nobody."""
    received = hand_over(tmp_path, {"trial-1": [torch.ones(1024)]})
    fd = received.outputs["trial-1"][0].fd
    assert fd is not None
    with pytest.raises(PermissionError):
        os.pwrite(fd, b"\0" * 4, 0)
    with pytest.raises(PermissionError):
        mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 0)
    with pytest.raises(PermissionError):
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0)  # F_SEAL_SEAL: the seals are final too
    judged = to_judge(received)["trial-1"][0]
    judged.fill_(5.0)  # the judge's private copy of the pages
    again = to_judge(received)["trial-1"][0]
    assert torch.equal(again, torch.ones(1024))
    received.close()


def test_an_output_changed_after_hand_over_reaches_the_judge_as_it_was_handed(
    tmp_path: Path,
) -> None:
    """The attack: a worker (or a candidate's thread) writes into its output after handing
    it over, or into the mapping `send_output` returns; the judge compares the bytes of the
    moment of hand-over, whatever the worker does next."""
    channels, worker = session(tmp_path)
    out = torch.ones(4096)
    kept = send_output(torch, "trial-1", [out], channel=worker)
    out.fill_(7.0)  # the worker's own tensor, changed once handed over
    kept[0].fill_(9.0)  # the worker's mapping of the handed-over pages: private
    worker.close()
    received = channels.finish(tmp_path)
    judged = to_judge(received)["trial-1"][0]
    assert torch.equal(judged, torch.ones(4096))
    received.close()


def test_nothing_is_left_open_or_named_after_an_output_is_closed(tmp_path: Path) -> None:
    before_fds, before_shm = memfds(), shm_entries()
    received = hand_over(tmp_path, {"trial-1": [torch.randn(256, 256)], "trial-2": [3.0]})
    assert len(memfds()) == len(before_fds) + 1  # the session holds the one tensor
    judged = to_judge(received)
    assert len(memfds()) == len(before_fds) + 1  # the judge's descriptors were closed
    del judged
    received.close()
    assert memfds() == before_fds
    assert shm_entries() == before_shm  # a memfd has no name in /dev/shm


def test_forwarded_outputs_live_only_as_long_as_the_judge_holds_them(tmp_path: Path) -> None:
    """Once forwarded, the session's descriptors close (`Received.handed_on`): each
    output's memory goes when the judge drops it, not when the evaluation ends; the bytes
    still count against the judge (high rather than low)."""
    before = memfds()
    received = hand_over(tmp_path, {"trial-1": [torch.randn(256, 256)], "trial-2": [torch.ones(8)]})
    channels = HandleChannels(2**30)
    ours, judge_end = handles.socket_pair()
    judgedir = tmp_path / "judge"
    try:
        channels.open(judgedir, ours)
        channels.forward(judgedir, received)
        judged = receive_outputs(torch, channel=judge_end)
        deadline = time.monotonic() + 30
        while any(
            leaf.fd is not None for out in received.outputs.values() for leaf in out.values()
        ):
            assert time.monotonic() < deadline, "the session kept its descriptors"
            time.sleep(0.01)
        assert channels.held_bytes(judgedir) == 256 * 256 * 4 + 8 * 4
        assert memfds() == before  # the judge's mappings are the last holders
        assert torch.equal(judged["trial-2"][0], torch.ones(8))
        assert mapped_outputs() == 2
        del judged
        gc.collect()
        assert mapped_outputs() == 0  # nothing holds the outputs' memory any more
    finally:
        judge_end.close()
        channels.close()
        received.close()


def test_the_session_refuses_outputs_over_its_limit_and_frees_them(tmp_path: Path) -> None:
    before = memfds()
    channels, worker = session(tmp_path, limit=4096)
    send_output(torch, "trial-1", [torch.zeros(512)], channel=worker)  # 2048 bytes: fits
    send_output(torch, "trial-2", [torch.zeros(1024)], channel=worker)  # 4096 more: refused
    worker.close()
    received = channels.finish(tmp_path)
    assert received.over_limit
    assert "more than 0 MB" in str(received.refused)
    assert list(received.outputs) == ["trial-1"]
    received.close()
    assert memfds() == before


def _unsealed_memfd(size: int) -> int:
    fd = os.memfd_create("forged", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    return fd


TENSOR = {"output": "trial-1", "leaf": 0, "kind": "tensor", "dtype": "float32", "shape": [4]}


def _forged(tmp_path: Path) -> dict[str, tuple[dict[str, object], list[int]]]:
    """Messages a hostile worker could send, each with the descriptors it attaches."""
    writable = _unsealed_memfd(16)
    kept_mapping = _unsealed_memfd(16)
    mapping = mmap.mmap(kept_mapping, 16)  # a writable shared mapping kept open
    fcntl.fcntl(
        kept_mapping,
        fcntl.F_ADD_SEALS,
        fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL | 0x10,  # FUTURE_WRITE
    )
    mapping.close()
    short = handles._sealed_copy(torch, "short", torch.zeros(2))
    regular = tmp_path / "file.bin"
    regular.write_bytes(b"\0" * 16)
    sealed = handles._sealed_copy(torch, "ok", torch.zeros(4))
    return {
        "not sealed against writes": (TENSOR, [writable]),
        "sealed for future writes only, a mapping kept": (TENSOR, [kept_mapping]),
        "holds fewer bytes than its shape": (TENSOR, [short]),
        "a file, not a memfd": (TENSOR, [os.open(regular, os.O_RDONLY)]),
        "no descriptor": (TENSOR, []),
        "two descriptors": (TENSOR, [sealed, os.dup(sealed)]),
        "an unknown dtype": ({**TENSOR, "dtype": "object"}, [os.dup(sealed)]),
        "a negative shape": ({**TENSOR, "shape": [-4]}, [os.dup(sealed)]),
        "a value with a descriptor": (
            {"output": "trial-1", "leaf": 0, "kind": "value", "value": 1},
            [os.dup(sealed)],
        ),
        "a name too long": ({**TENSOR, "output": "x" * 65}, [os.dup(sealed)]),
        "a leaf index out of range": ({**TENSOR, "leaf": 10**6}, [os.dup(sealed)]),
    }


def test_every_forged_message_is_refused_and_its_descriptors_closed(tmp_path: Path) -> None:
    before = memfds()
    for why, (line, fds) in _forged(tmp_path).items():
        channels, worker = session(tmp_path)
        raw_send(worker, line, fds)
        for fd in set(fds):
            os.close(fd)  # the worker's own copies
        worker.close()
        received = channels.finish(tmp_path)
        assert received.refused is not None, why
        assert received.outputs == {}, why
        received.close()
    assert memfds() == before


def test_an_output_sent_twice_is_refused(tmp_path: Path) -> None:
    """A candidate that hands over its own "trial-1" before the harness does cannot have
    either one believed."""
    channels, worker = session(tmp_path)
    send_output(torch, "trial-1", [torch.zeros(4)], channel=worker)
    send_output(torch, "trial-1", [torch.ones(4)], channel=worker)
    worker.close()
    received = channels.finish(tmp_path)
    assert received.refused == "output trial-1 leaf 0 sent after its end"
    received.close()


def test_a_message_that_is_not_json_is_refused(tmp_path: Path) -> None:
    channels, worker = session(tmp_path)
    socket.send_fds(worker, [b"\xff not json"], [])
    worker.close()
    received = channels.finish(tmp_path)
    assert received.refused is not None
    received.close()


def test_a_worker_without_a_channel_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(handles.HANDLE_FD_ENV, raising=False)
    with pytest.raises(HandleError, match="KERNELPRO_HANDLE_FD unset"):
        send_output(torch, "trial-1", [torch.zeros(1)])


def test_a_judge_whose_session_closed_early_fails(tmp_path: Path) -> None:
    ours, judge_end = handles.socket_pair()
    raw_send(ours, {"output": "trial-1", "leaf": 0, "kind": "value", "value": 1}, [])
    ours.close()
    with pytest.raises(HandleError, match="before the end message"):
        receive_outputs(torch, channel=judge_end)
    judge_end.close()


# ----- a judge beside the worker: each output relayed as it comes (`handles.Relay`) -----


def streamed(tmp_path: Path) -> tuple[HandleChannels, socket.socket, socket.socket, Path]:
    """A session relaying the worker of `tmp_path/worker` to the judge of `tmp_path/judge`;
    (channels, the worker's end, the judge's end, the worker's directory)."""
    channels = HandleChannels(2**30)
    worker_dir, judge_dir = tmp_path / "worker", tmp_path / "judge"
    channels.stream(worker_dir, judge_dir)
    ours, worker = handles.socket_pair()
    channels.open(worker_dir, ours)
    ours, judge_end = handles.socket_pair()
    channels.open(judge_dir, ours)
    return channels, worker, judge_end, worker_dir


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_each_output_reaches_the_judge_when_whole_and_counts_until_the_judge_checked_it(
    tmp_path: Path,
) -> None:
    before = memfds()
    channels, worker, judge_end, worker_dir = streamed(tmp_path)
    try:
        outputs = handles.stream_outputs(torch, judge_end, acknowledge=True)
        send_output(torch, "trial-1", [torch.full((64, 64), 2.0), 3], channel=worker)
        name, leaves = next(outputs)  # arrives before the worker has made the next one
        assert name == "trial-1"
        assert torch.equal(leaves[0], torch.full((64, 64), 2.0))
        assert leaves[1] == 3
        assert channels.held_bytes(worker_dir) == 64 * 64 * 4  # counted: not checked yet
        _wait_for(lambda: len(memfds()) == len(before), "the session kept its descriptor")
        del leaves
        send_output(torch, "trial-2", [torch.ones(8)], channel=worker)
        # Asking for the next output is the word that this one is checked and dropped.
        name, leaves = next(outputs)
        handles.await_checked("trial-1", channel=worker)
        assert name == "trial-2"
        assert channels.held_bytes(worker_dir) == 8 * 4  # trial-1's bytes left the count
        assert channels.judge_time_s(worker_dir) > 0  # the worker's wait: not its run time
        assert mapped_outputs() == 1  # trial-2's; trial-1's memory is gone
        channels.end_stream(worker_dir, judged=True)
        assert list(outputs) == []  # the end message: nothing more
        handles.await_checked("trial-2", channel=worker)
        assert channels.held_bytes(worker_dir) == 0
        del leaves
        gc.collect()
        assert mapped_outputs() == 0
    finally:
        worker.close()
        judge_end.close()
        channels.close()
    assert memfds() == before


def test_only_the_judges_word_frees_an_output_not_the_workers(tmp_path: Path) -> None:
    """A worker that says "checked" itself frees nothing and hears nothing: the count and the
    wait are the judge's."""
    channels, worker, judge_end, worker_dir = streamed(tmp_path)
    try:
        outputs = handles.stream_outputs(torch, judge_end, acknowledge=True)
        send_output(torch, "trial-1", [torch.ones(16)], channel=worker)
        raw_send(worker, {"checked": "trial-1"}, [])
        name, _leaves = next(outputs)
        time.sleep(0.2)
        assert channels.held_bytes(worker_dir) == 16 * 4
        worker.settimeout(0.2)
        with pytest.raises(TimeoutError):
            worker.recv(100)  # the session said nothing to the worker
    finally:
        worker.close()
        judge_end.close()
        channels.close()


def test_the_judges_refusal_reaches_the_worker_with_its_acknowledgment(tmp_path: Path) -> None:
    """The judge's reason for refusing an output (`failures`, set before it asks for the next)
    goes with its acknowledgment through the session to the waiting worker, cut to
    `MAX_FAILURE` characters; an output it passed is acknowledged without one. A worker that
    sends a refusal itself (a "checked" word with a reason) is not heard, as any word of
    its own."""
    channels, worker, judge_end, _worker_dir = streamed(tmp_path)
    try:
        failures: dict[str, str] = {}
        outputs = handles.stream_outputs(torch, judge_end, acknowledge=True, failures=failures)
        send_output(torch, "trial-1", [torch.ones(4)], channel=worker)
        name, _leaves = next(outputs)
        send_output(torch, "trial-2", [torch.ones(4)], channel=worker)
        name, _leaves = next(outputs)  # trial-1 passed: no reason set for it
        assert handles.await_checked("trial-1", channel=worker) is None
        raw_send(worker, {"checked": "trial-2", "failed": "the worker's own word"}, [])
        failures[name] = "x" * (handles.MAX_FAILURE + 500)
        channels.end_stream(_worker_dir, judged=True)
        assert list(outputs) == []
        said = handles.await_checked("trial-2", channel=worker)
        assert said == "x" * handles.MAX_FAILURE
    finally:
        worker.close()
        judge_end.close()
        channels.close()


def test_a_stream_ended_without_a_verdict_shuts_the_judges_channel(tmp_path: Path) -> None:
    before = memfds()
    channels, worker, judge_end, worker_dir = streamed(tmp_path)
    try:
        send_output(torch, "trial-1", [torch.ones(16)], channel=worker)
        channels.end_stream(worker_dir, judged=False)  # the worker ended wrong
        with pytest.raises(HandleError, match="the session closed the channel"):
            list(handles.stream_outputs(torch, judge_end, acknowledge=True))
        handles.await_checked("trial-1", channel=worker)  # nobody left waiting
    finally:
        worker.close()
        judge_end.close()
        channels.close()
    gc.collect()
    assert memfds() == before


def test_a_judge_that_dies_leaves_no_worker_waiting(tmp_path: Path) -> None:
    channels, worker, judge_end, worker_dir = streamed(tmp_path)
    try:
        send_output(torch, "trial-1", [torch.ones(16)], channel=worker)
        relay = channels._relays[worker_dir]
        _wait_for(lambda: "trial-1" in relay.pending, "trial-1 not forwarded")
        judge_end.close()  # killed before it checked anything
        handles.await_checked("trial-1", channel=worker)
        assert channels.held_bytes(worker_dir) == 0
        send_output(torch, "trial-2", [torch.ones(16)], channel=worker)  # kept, told at once
        handles.await_checked("trial-2", channel=worker)
    finally:
        worker.close()
        channels.close()


def test_closing_the_channels_stops_a_relay_never_ended(tmp_path: Path) -> None:
    """An evaluation that fails between starting a relay and ending it still closes its
    channels: the relay's sender must stop then, not poll for the rest of the session."""
    before = set(threading.enumerate())
    channels, worker, judge_end, worker_dir = streamed(tmp_path)
    send_output(torch, "trial-1", [torch.ones(16)], channel=worker)
    relay = channels._relays[worker_dir]
    _wait_for(lambda: "trial-1" in relay.pending, "trial-1 not forwarded")
    (sender,) = [t for t in set(threading.enumerate()) - before if t.name == "kernelpro-relay"]
    worker.close()
    judge_end.close()
    channels.close()
    sender.join(timeout=60)  # a deadline for the failure only: it ends at its next turn
    assert not sender.is_alive()


def test_without_a_judge_beside_it_the_worker_hears_at_once_and_the_outputs_are_kept(
    tmp_path: Path,
) -> None:
    channels, worker = session(tmp_path)
    send_output(torch, "trial-1", [torch.ones(16)], channel=worker)
    handles.await_checked("trial-1", channel=worker)
    send_output(torch, "trial-2", [torch.ones(16)], channel=worker)
    handles.await_checked("trial-2", channel=worker)
    worker.close()
    received = channels.finish(tmp_path)
    assert list(received.outputs) == ["trial-1", "trial-2"]  # for a judge started after
    assert received.peak_nbytes == 2 * 64
    received.close()


def test_an_output_whose_end_names_other_leaves_is_refused(tmp_path: Path) -> None:
    channels, worker = session(tmp_path)
    line = {"output": "trial-1", "leaf": 0, "kind": "value", "value": 1}
    raw_send(worker, line, [])
    raw_send(worker, {"sent": "trial-1", "leaves": 2}, [])  # one leaf was sent, not two
    handles.await_checked("trial-1", channel=worker)  # answered all the same
    worker.close()
    received = channels.finish(tmp_path)
    assert received.refused == "output trial-1: 2 leaves said, others sent"
    received.close()


def test_the_judges_time_counts_only_while_it_holds_an_output(tmp_path: Path) -> None:
    """The worker's run timeout leaves out the time it waited for the judge: counted from an
    output's forwarding to the judge's word, and not while nothing is at the judge."""
    channels, worker, judge_end, worker_dir = streamed(tmp_path)
    try:
        assert channels.judge_time_s(worker_dir) == 0.0
        outputs = handles.stream_outputs(torch, judge_end, acknowledge=True)
        send_output(torch, "trial-1", [torch.ones(16)], channel=worker)
        next(outputs)
        relay = channels._relays[worker_dir]
        assert relay.busy_since is not None  # at the judge: counting
        channels.end_stream(worker_dir, judged=True)
        assert list(outputs) == []
        handles.await_checked("trial-1", channel=worker)
        assert relay.busy_since is None
        counted = relay.judge_time_s()
        assert counted > 0
        time.sleep(0.05)
        assert relay.judge_time_s() == counted  # nothing at the judge: not counting
    finally:
        worker.close()
        judge_end.close()
        channels.close()


def _sealed_bytes(tensor: object) -> bytes:
    fd = handles._sealed_copy(torch, "copy", tensor)
    try:
        return os.pread(fd, 1 << 30, 0)
    finally:
        os.close(fd)


def test_a_sealed_copy_holds_the_tensors_bytes_in_order() -> None:
    tensor = torch.randn(37, 29).t()  # not contiguous: copied in element order
    assert _sealed_bytes(tensor) == tensor.contiguous().numpy().tobytes()


@pytest.mark.gpu
def test_a_gpu_tensor_reaches_its_sealed_copy_through_the_bounce_buffer_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # chunks of 1000 bytes: several bounces, the last one short
    monkeypatch.setattr(handles, "BOUNCE_BYTES", 1000)
    tensor = torch.randn(257, 33)
    assert _sealed_bytes(tensor.cuda()) == tensor.numpy().tobytes()


def test_messages_queued_when_the_process_ended_are_read_after_the_wait_ran_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reading thread kept from the CPU (a loaded machine), stood in for by a slow check
    # of each message: the channel is shut after FINISH_WAIT_S, and the messages already
    # queued are still read (a shut channel ends the stream after them, not before).
    monkeypatch.setattr(handles, "FINISH_WAIT_S", 0.05)
    slow = handles.validate

    def validate_slowly(line: object, fds: object) -> object:
        time.sleep(0.3)
        return slow(line, fds)  # type: ignore[arg-type]

    monkeypatch.setattr(handles, "validate", validate_slowly)
    channels, worker = session(tmp_path)
    send_output(torch, "trial-1", [torch.zeros(4), torch.ones(4)], channel=worker)
    send_output(torch, "trial-2", [torch.ones(3)], channel=worker)
    worker.close()
    received = channels.finish(tmp_path)
    assert sorted(received.outputs) == ["trial-1", "trial-2"]
    assert received.refused is None
    received.close()


def test_a_worker_that_exits_with_a_word_unread_loses_none_of_its_queued_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race behind a duplicate hand-over once read as accepted on a loaded machine: the
    # session answers the first "sent" ({"checked": NAME}, which this worker never reads),
    # the worker sends the rest and exits before the reading thread reads it. Linux then
    # fails the session's next read with ECONNRESET (a peer closed with unread data) while
    # the worker's last messages are still queued behind it. Made certain here: the reading
    # thread waits, after its answer, until the worker has exited.
    answered, exited = threading.Event(), threading.Event()
    answer = HandleChannels._sent

    def answer_then_lose_the_cpu(self: HandleChannels, *args: object) -> None:
        answer(self, *args)  # type: ignore[arg-type]
        answered.set()
        assert exited.wait(timeout=60)  # a lost wait fails the test, never passes it

    monkeypatch.setattr(HandleChannels, "_sent", answer_then_lose_the_cpu)
    channels, worker = session(tmp_path)
    send_output(torch, "trial-1", [torch.zeros(4)], channel=worker)
    assert answered.wait(timeout=60)
    send_output(torch, "trial-1", [torch.ones(4)], channel=worker)
    send_output(torch, "trial-2", [torch.ones(3)], channel=worker)
    worker.close()  # the word about trial-1 is still unread in it
    exited.set()
    received = channels.finish(tmp_path)
    assert received.refused == "output trial-1 leaf 0 sent after its end"
    assert sorted(received.outputs) == ["trial-1"]  # trial-2 came after the refusal
    received.close()


# ----- the judge's truth for the worker (`handles.send_truth`, `handles.await_truth`) -----

TRUTH = {"reduced": None, "truth": {"precision": "float64", "skipped": None, "leaves": {}}}


@pytest.mark.parametrize("judge_first", [True, False], ids=["told first", "asked first"])
def test_the_worker_gets_the_judges_truth_whichever_comes_first(
    tmp_path: Path, judge_first: bool
) -> None:
    """The judge's truth reaches the worker once it asks, sent before or after; the wait is
    the judge's time, not the candidate's."""
    channels, worker, judge_end, worker_dir = streamed(tmp_path)
    relay = channels._relays[worker_dir]
    try:
        if judge_first:
            handles.send_truth(TRUTH, channel=judge_end)
            _wait_for(lambda: relay.truth_known, "the judge's truth not received")
        else:
            raw_send(worker, {"await": "truth"}, [])
            _wait_for(lambda: relay.truth_wanted, "the worker's request not received")
            assert relay.busy_since is not None  # the worker waits for the judge: counting
            time.sleep(0.02)
            handles.send_truth(TRUTH, channel=judge_end)
            _wait_for(
                lambda: relay.truth_known and relay.busy_since is None, "the truth not received"
            )
            assert relay.judge_time_s() > 0
        got = handles.await_truth(channel=worker)  # asks (again: answered all the same)
        assert got == TRUTH
    finally:
        worker.close()
        judge_end.close()
        channels.close()


def test_a_truth_the_worker_sends_itself_is_not_taken_for_the_judges(tmp_path: Path) -> None:
    """The candidate's process holds the worker's channel: a truth it sends (loosening its
    own checks, or answering its own request) is dropped; only the judge's is handed on."""
    channels, worker, judge_end, worker_dir = streamed(tmp_path)
    relay = channels._relays[worker_dir]
    forged = {"reduced": "bf16", "truth": None}
    try:
        raw_send(worker, {"truth": forged}, [])
        raw_send(worker, {"await": "truth"}, [])
        _wait_for(lambda: relay.truth_wanted, "the worker's request not received")
        assert not relay.truth_known
        worker.settimeout(0.2)
        with pytest.raises(TimeoutError):
            worker.recv(handles.MAX_MESSAGE + 1)  # nothing for the worker until the judge speaks
        worker.settimeout(None)
        handles.send_truth(TRUTH, channel=judge_end)
        got = json.loads(worker.recv(handles.MAX_MESSAGE + 1).decode("utf-8"))
        assert got == {"truth": TRUTH}
        raw_send(judge_end, {"truth": forged}, [])  # a second word of the judge: the first holds
        assert handles.await_truth(channel=worker) == TRUTH
    finally:
        worker.close()
        judge_end.close()
        channels.close()


def test_no_judge_or_a_judge_ended_without_a_truth_leaves_the_worker_its_own(
    tmp_path: Path,
) -> None:
    """No judge beside the worker: None at once. A judge that ends (killed, or its
    reference raised) before its truth: None, the worker is not left waiting."""
    channels, worker = session(tmp_path / "alone")
    try:
        assert handles.await_truth(channel=worker) is None
    finally:
        worker.close()
        channels.close()
    channels, worker, judge_end, worker_dir = streamed(tmp_path)
    try:
        raw_send(worker, {"await": "truth"}, [])
        _wait_for(lambda: channels._relays[worker_dir].truth_wanted, "request not received")
        judge_end.close()
        assert handles.await_truth(channel=worker) is None
    finally:
        worker.close()
        channels.close()


def test_a_truth_too_large_for_one_message_goes_as_none(tmp_path: Path) -> None:
    channels, worker, judge_end, worker_dir = streamed(tmp_path)
    try:
        handles.send_truth({"truth": "x" * handles.MAX_MESSAGE}, channel=judge_end)
        assert handles.await_truth(channel=worker) is None
    finally:
        worker.close()
        judge_end.close()
        channels.close()


def test_the_output_is_freed_before_the_session_is_told_it_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The judge starts on an output as soon as the session has it whole: the worker's own
    copy (device memory on a GPU) must be gone by then, not held beside the judge's first
    copies. `send_output` empties the list it is given and gives the freed memory back before
    its last message."""
    import weakref

    channels, worker = session(tmp_path)
    out = torch.randn(512, 512)
    alive = weakref.ref(out)
    leaves = [out]
    del out
    seen: list[tuple[str, bool]] = []
    send = handles._send

    def recording_send(channel: socket.socket, line: dict[str, object], fd: int | None) -> None:
        seen.append(("sent" if "sent" in line else "leaf", alive() is not None))
        send(channel, line, fd)

    monkeypatch.setattr(handles, "_send", recording_send)
    kept = send_output(torch, "trial-1", leaves, channel=worker)
    assert leaves == []
    assert seen == [("leaf", True), ("sent", False)]
    worker.close()
    received = channels.finish(tmp_path)
    assert torch.equal(to_judge(received)["trial-1"][0], kept[0])
    received.close()
