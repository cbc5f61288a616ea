"""Checked outputs by handle: a worker's outputs reach the judge as sealed shared-memory file
descriptors passed over a Unix socket, never through a file system.

Every sandboxed process (`SandboxEvaluator.start_sandboxed`: worker, judge, standby) is
started with one end of a `SOCK_SEQPACKET` socket pair (the descriptor number in
`$KERNELPRO_HANDLE_FD`); the session keeps the other end (`HandleChannels`).

- The worker (`send_output`) copies each tensor leaf of a checked output into a new memfd
  (`memfd_create`: anonymous shared memory with no name in any file system, so no /dev/shm
  entry exists to leak), unmaps it, seals it against writing, growing and shrinking
  (`F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL`) and sends the descriptor with
  a one-line manifest (`SCM_RIGHTS`). One copy from the device (a CUDA tensor is copied once
  into the memfd's pages: legacy CUDA IPC handles do not open across the PID namespaces
  the worker and the judge each run in, `isolation.py`).
- The session (`HandleChannels`, a receiving thread per process) validates every message as
  it arrives: a known dtype, a whole shape, a descriptor that is a memfd, sealed, of exactly
  the size the shape implies; the total is counted against the outputs limit and the
  evaluation's memory. Anything else is kept as the reason the outputs are refused.
- The judge gets the descriptors the session holds (`send_outputs`, then an end message)
  and maps each one privately (`MAP_PRIVATE` of a write-sealed memfd): nobody can change the
  bytes it compares once the worker handed them over, the candidate included. Once sent,
  the session closes its own descriptors (`Received.handed_on`): the judge's mapping is
  then the last holder of each output, which it drops once that output is checked.

What frees the memory: a memfd lives while a descriptor or a mapping of it does. The
worker's die with its PID namespace (killed or not), the session closes its own once it
forwarded them to the judge or when the evaluation ends (`HandleChannels.close`), the
judge's die with the judge (or go as it checks each output). Nothing has a name,
so nothing outlives the processes.

Manifest lines (JSON): `{"output": NAME, "leaf": K, "kind": "tensor", "dtype": D, "shape":
[...]}` with one descriptor (none for an empty tensor), `{"output": NAME, "leaf": K, "kind":
"value", "value": V}`, and `{"end": true}` from the session to the judge.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HANDLE_FD_ENV = "KERNELPRO_HANDLE_FD"
# dtype name in a manifest -> torch dtype attribute; anything else is refused.
DTYPES = (
    "float64", "float32", "float16", "bfloat16", "complex64", "complex128",
    "int64", "int32", "int16", "int8", "uint8", "bool",
)  # fmt: skip
# Bytes per element of each dtype in DTYPES.
ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip
MAX_LEAVES = 4096  # leaves of all outputs of one evaluation
MAX_MESSAGE = 64 * 1024  # bytes of one manifest line
# Characters of a judge's failure carried with its acknowledgment (`stream_outputs`): the
# gate's rule says why in a line or two; the rest is cut, never the message refused.
MAX_FAILURE = 2000
FINISH_WAIT_S = 10.0  # after the process ended, for the messages it left queued
SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL


class HandleError(Exception):
    """An output could not be handed over, or a message broke the channel's rules."""


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(the session's end, the process's end, inheritable) of a new channel."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.set_inheritable(True)
    return ours, theirs


def _process_socket() -> socket.socket | None:
    """This process's end of its channel ($KERNELPRO_HANDLE_FD), None without one."""
    value = os.environ.get(HANDLE_FD_ENV)
    if not value or not value.isdigit():
        return None
    return _PROCESS_SOCKET.get(int(value))


class _SocketOnce:
    def __init__(self) -> None:
        self._sockets: dict[int, socket.socket] = {}
        self._lock = threading.Lock()

    def get(self, fd: int) -> socket.socket:
        with self._lock:
            if fd not in self._sockets:
                self._sockets[fd] = socket.socket(fileno=fd)
            return self._sockets[fd]


_PROCESS_SOCKET = _SocketOnce()


def nbytes_of(shape: list[int], dtype: str) -> int:
    """Bytes of a tensor of `shape` and `dtype` (a name in DTYPES)."""
    numel = 1
    for n in shape:
        numel *= n
    return numel * ITEMSIZE[dtype]


# ----- the worker: one output out -----


def send_output(
    torch: Any, name: str, leaves: Iterable[Any], channel: socket.socket | None = None
) -> list[Any]:
    """Hand one checked output's leaves to the session over `channel` (this process's
    channel when None). Returns the leaves as handed over: each tensor a private mapping of
    its sealed memfd (the same pages as the session's, no copy), values as sent.

    A list of `leaves` is emptied as its leaves are copied, and this process's freed memory
    given back (`release_freed_heap`) before the session is told the output is whole: the
    judge starts on it at once, so where the caller gave away its last reference
    (`judge.save_output`), the output's memory on the device is free by then, never held
    beside the judge's first copies."""
    channel = channel or _process_socket()
    if channel is None:
        raise HandleError(
            f"no handle channel in this process (${HANDLE_FD_ENV} unset): output {name} has "
            "nowhere to go; the worker runs only under SandboxEvaluator"
        )
    kept: list[Any] = []
    pending = leaves if isinstance(leaves, list) else list(leaves)
    pending.reverse()
    for k in range(len(pending)):
        leaf = pending.pop()
        if isinstance(leaf, torch.Tensor):
            dtype = str(leaf.dtype).removeprefix("torch.")
            if dtype not in DTYPES:
                raise HandleError(
                    f"output {name} leaf {k} has dtype {leaf.dtype}, not one of {DTYPES}"
                )
            line = {"output": name, "leaf": k, "kind": "tensor", "dtype": dtype,
                    "shape": list(leaf.shape)}  # fmt: skip
            fd = _sealed_copy(torch, f"kernelpro-{name}-{k}", leaf) if leaf.numel() else None
            try:
                _send(channel, line, fd)
                kept.append(_mapped(torch, validate(line, [fd] if fd is not None else [])[2]))
            finally:
                if fd is not None:
                    os.close(fd)
        else:
            value = (
                leaf if isinstance(leaf, (bool, int, float)) or leaf is None else repr(leaf)[:200]
            )
            _send(channel, {"output": name, "leaf": k, "kind": "value", "value": value}, None)
            kept.append(value)
    leaf = None
    release_freed_heap()
    # The output is whole: the session may forward it to the judge now (`Relay`).
    _send(channel, {"sent": name, "leaves": len(kept)}, None)
    return kept


def release_freed_heap() -> None:
    """Give the heap glibc keeps after frees back to the system (`malloc_trim`), and the
    blocks torch's CUDA allocator keeps cached back to the device: the worker and the judge
    take turns on one machine and one GPU, and what one freed should not stay held while the
    other works (`footprint.py` counts their device copies as taking turns too). Nothing
    where the allocator is not glibc's, or where this process never used CUDA."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def checked_word(name: str, failed: str | None = None) -> dict[str, Any]:
    """The word that output `name` was checked, from the judge to the session and from the
    session to the worker: with the judge's reason where it refused it, cut to
    `MAX_FAILURE` characters."""
    return (
        {"checked": name} if failed is None else {"checked": name, "failed": failed[:MAX_FAILURE]}
    )


def await_checked(name: str, channel: socket.socket | None = None) -> str | None:
    """Wait until the session says output `name` was checked (by the judge, or kept for it):
    the worker makes its next output only then, so one handed-over output is held at a time.
    Returns why the judge refused it (`{"checked": NAME, "failed": WHY}`), None where it
    passed, was kept for a judge that checks after the worker ended, or no judge decided (its
    channel broke: its verdict says so). This process's freed memory was given back before
    the output was said whole (`send_output`)."""
    channel = channel or _process_socket()
    if channel is None:
        return None
    while True:
        data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE + 1, 4)
        for fd in fds:
            os.close(fd)
        if not data:
            raise HandleError(f"the session closed the channel before output {name} was checked")
        line = json.loads(data.decode("utf-8"))
        if isinstance(line, dict) and line.get("checked") == name:
            failed = line.get("failed")
            return failed if isinstance(failed, str) else None


def await_truth(channel: socket.socket | None = None) -> dict[str, Any] | None:
    """Ask the session for the judge's truth (`{"await": "truth"}`) and wait for it: what the
    judge beside this worker found on the first checked call's inputs before any output was
    handed over (`judge.judge`, `measurement.truth_payload`), so this worker finds none of
    its own. None: no channel, no judge beside it, or the judge ended or sent none (the
    worker then finds its own truth)."""
    channel = channel or _process_socket()
    if channel is None:
        return None
    release_freed_heap()  # the judge's memory is in use while this process waits
    try:
        _send(channel, {"await": "truth"}, None)
    except OSError:
        return None
    while True:
        data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE + 1, 4)
        for fd in fds:
            os.close(fd)
        if not data:
            raise HandleError("the session closed the channel before the judge's truth came")
        line = json.loads(data.decode("utf-8"))
        if isinstance(line, dict) and "truth" in line:
            found = line["truth"]
            return found if isinstance(found, dict) else None


def send_truth(payload: dict[str, Any] | None, channel: socket.socket | None = None) -> None:
    """The judge's truth to the session (`{"truth": PAYLOAD}`), which hands it to the worker
    beside it when that asks (`await_truth`); `{"truth": null}` where it does not fit one
    message (the worker then finds its own)."""
    channel = channel or _process_socket()
    if channel is None:
        return
    try:
        _send(channel, {"truth": payload}, None)
    except HandleError:
        _send(channel, {"truth": None}, None)


def _sealed_copy(torch: Any, label: str, tensor: Any) -> int:
    """A memfd holding `tensor`'s elements (contiguous), sealed against any change."""
    fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, tensor.numel() * tensor.element_size())
        # The memfd's pages are the destination: no host temporary of the tensor's size.
        target = torch.from_file(
            f"/proc/self/fd/{fd}", shared=True, size=tensor.numel(), dtype=tensor.dtype
        )
        _copy_to_host(torch, target, tensor.detach().reshape(-1))
        del target  # unmapped: a writable shared mapping would refuse F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


BOUNCE_BYTES = 2**26  # a GPU tensor reaches the memfd through a pinned buffer this large


def _copy_to_host(torch: Any, target: Any, flat: Any) -> None:
    """`target` (host, shared pages) = `flat`. From a GPU, in chunks through one pinned
    buffer: a copy straight into pageable shared pages runs at a fraction of the bus's speed
    (the driver stages it and the pages fault in on the way)."""
    if flat.device.type != "cuda":
        target.copy_(flat)
        return
    step = max(1, BOUNCE_BYTES // max(1, flat.element_size()))
    bounce = torch.empty(min(step, flat.numel()), dtype=flat.dtype, pin_memory=True)
    for start in range(0, flat.numel(), step):
        part = flat[start : start + step]
        staged = bounce[: part.numel()]
        staged.copy_(part)  # synchronous: the pinned buffer holds the chunk when it returns
        target[start : start + part.numel()].copy_(staged)


def _send(channel: socket.socket, line: dict[str, Any], fd: int | None) -> None:
    data = json.dumps(line).encode("utf-8")
    if len(data) > MAX_MESSAGE:
        raise HandleError(f"a manifest line of {len(data)} bytes passes {MAX_MESSAGE}")
    socket.send_fds(channel, [data], [fd] if fd is not None else [])


# ----- the session: received, validated, counted, forwarded -----


@dataclass
class Leaf:
    """One validated leaf: a tensor's dtype, shape and sealed memfd (or a plain value)."""

    kind: str
    dtype: str = ""
    shape: list[int] = field(default_factory=list)
    fd: int | None = None
    value: Any = None

    def line(self, output: str, k: int) -> dict[str, Any]:
        if self.kind == "value":
            return {"output": output, "leaf": k, "kind": "value", "value": self.value}
        return {"output": output, "leaf": k, "kind": "tensor", "dtype": self.dtype,
                "shape": self.shape}  # fmt: skip


def validate(line: Any, fds: list[int]) -> tuple[str, int, Leaf]:
    """(output name, leaf index, leaf) of one received message; raises `HandleError` naming
    what is wrong. The descriptors are the caller's to close either way."""
    if not isinstance(line, dict):
        raise HandleError("a message is not a JSON object")
    output, k, kind = line.get("output"), line.get("leaf"), line.get("kind")
    if not isinstance(output, str) or not output or len(output) > 64:
        raise HandleError(f"a message names output {output!r}")
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < MAX_LEAVES:
        raise HandleError(f"output {output}: leaf index {k!r}")
    if kind == "value":
        value = line.get("value")
        if fds or not (value is None or isinstance(value, (bool, int, float, str))):
            raise HandleError(f"output {output} leaf {k}: not a plain value")
        return output, k, Leaf("value", value=value)
    dtype, shape = line.get("dtype"), line.get("shape")
    if kind != "tensor" or dtype not in DTYPES:
        raise HandleError(f"output {output} leaf {k}: kind/dtype {kind}/{dtype}")
    if (
        not isinstance(shape, list)
        or len(shape) > 16
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        raise HandleError(f"output {output} leaf {k}: shape {shape!r}")
    size = nbytes_of(shape, dtype)
    if size == 0:
        if fds:
            raise HandleError(f"output {output} leaf {k}: an empty tensor with a descriptor")
        return output, k, Leaf("tensor", dtype, shape)
    if len(fds) != 1:
        raise HandleError(f"output {output} leaf {k}: {len(fds)} descriptors, not 1")
    check_sealed_memfd(fds[0], size, f"output {output} leaf {k}")
    return output, k, Leaf("tensor", dtype, shape, fds[0])


def check_sealed_memfd(fd: int, size: int, what: str) -> None:
    """`fd` is a memfd of exactly `size` bytes that nobody can write, grow or shrink."""
    info = os.fstat(fd)
    link = os.readlink(f"/proc/self/fd/{fd}")
    if not stat.S_ISREG(info.st_mode) or not link.startswith("/memfd:"):
        raise HandleError(f"{what}: the descriptor is {link!r}, not a sealed memfd")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        raise HandleError(f"{what}: the memfd cannot be sealed ({exc})") from None
    if seals & SEALS != SEALS:
        raise HandleError(f"{what}: the memfd is not sealed against writes (seals {seals:#x})")
    if info.st_size != size:
        raise HandleError(f"{what}: the memfd holds {info.st_size} bytes, its shape needs {size}")


@dataclass
class Received:
    """What one process sent: validated outputs, their bytes, or why they are refused."""

    outputs: dict[str, dict[int, Leaf]] = field(default_factory=dict)
    nbytes: int = 0
    sent: set[str] = field(default_factory=set)  # outputs the process said were whole
    peak_nbytes: int = 0  # the most held at once (a relay's judge frees each once checked)
    refused: str | None = None
    over_limit: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        with self.lock:
            self._close_descriptors()
            self.outputs.clear()
            self.nbytes = 0

    def handed_on(self) -> None:
        """The outputs were forwarded to their judge: the session's descriptors close, so
        each output's memory goes as soon as the judge has checked it and dropped its mapping
        (`judge.judge`), not when the evaluation ends. `nbytes` still counts them: the
        session cannot see which the judge has dropped, and counts high rather than low."""
        with self.lock:
            self._close_descriptors()

    def _close_descriptors(self) -> None:
        for leaves in self.outputs.values():
            for leaf in leaves.values():
                if leaf.fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(leaf.fd)
                    leaf.fd = None


@dataclass
class Relay:
    """A worker's outputs on their way to the judge that checks them as they come: each whole
    output is forwarded at once (its leaves, then `{"sent": NAME}`) and the session's
    descriptors closed; its bytes stay counted (`pending`) until the judge says it checked
    and dropped it, and that word goes on to the waiting worker (`handles.await_checked`).
    `{"end": true}` follows once the worker ended correct; a relay ended otherwise shuts the
    judge's channel (its verdict is not needed)."""

    worker: Path
    judge: Path
    queue: list[tuple[dict[str, Any] | None, int | None]] = field(default_factory=list)
    pending: dict[str, int] = field(default_factory=dict)  # forwarded, not yet checked: bytes
    aborted: bool = False
    broken: bool = False  # the judge's channel failed: every output is acknowledged at once
    # Wall time with an output at the judge (the worker waits then): not the candidate's time.
    busy_since: float | None = None
    busy_s: float = 0.0
    # The judge's truth (`send_truth`) for the worker (`await_truth`): known once the judge
    # sent it or ended (None then), handed over once the worker asked.
    truth: dict[str, Any] | None = None
    truth_known: bool = False
    truth_wanted: bool = False

    def judge_time_s(self) -> float:
        """Seconds so far during which the judge held an output of this worker."""
        since = self.busy_since
        return self.busy_s + (time.monotonic() - since if since is not None else 0.0)

    ready: threading.Condition = field(default_factory=threading.Condition)


ABORT = None  # a relay queue's last entry when the judge's verdict is not needed


class HandleChannels:
    """The session's ends of every sandboxed process's channel, by scratch directory."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._ends: dict[Path, socket.socket] = {}
        self._received: dict[Path, Received] = {}
        self._threads: dict[Path, threading.Thread] = {}
        # Outputs to forward to the process of a directory (a judge), sent when its channel
        # opens or at once when it is open (a judge started ahead).
        self._outbox: dict[Path, Received] = {}
        # Judges checking a running worker's outputs as they come, by the worker's and the
        # judge's directory.
        self._relays: dict[Path, Relay] = {}
        self._relay_of_judge: dict[Path, Relay] = {}
        self._lock = threading.Lock()
        # Channels never finished (an evaluator dropped without `close`) are closed when
        # these channels go, not left to the garbage collector, which warns about each
        # unclosed socket wherever it happens to run.
        weakref.finalize(self, _close_ends, self._ends)

    def open(self, workdir: Path, end: socket.socket) -> None:
        """Keep `end` for the process of `workdir` and receive what it sends; forward what
        waits for it. A channel still open for `workdir` (a standby ended unused, its
        directory handed to a fresh process) is closed first."""
        if self.end_of(workdir) is not None:
            self.finish(workdir).close()
        received = Received()
        thread = threading.Thread(
            target=self._receive,
            args=(workdir, end, received),
            daemon=True,
            name="kernelpro-handles",
        )
        with self._lock:
            self._ends[workdir] = end
            self._received[workdir] = received
            self._threads[workdir] = thread
            outbox = self._outbox.get(workdir)
            relay = self._relay_of_judge.get(workdir)
            if relay is not None and relay.aborted:  # its worker ended before it started
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
        thread.start()
        if relay is not None:
            with relay.ready:
                relay.ready.notify_all()
        if outbox is not None:
            _start_sending(end, outbox)

    def forward(self, workdir: Path, outputs: Received) -> None:
        """Send `outputs` to the process of `workdir` (now, or when it starts)."""
        with self._lock:
            self._outbox[workdir] = outputs
            end = self._ends.get(workdir)
        if end is not None:
            _start_sending(end, outputs)

    def stream(self, worker: Path, judge: Path) -> None:
        """Forward each whole output the process of `worker` hands over to the process of
        `judge` as it comes (`Relay`); call before either starts."""
        relay = Relay(worker, judge)
        with self._lock:
            self._relays[worker] = relay
            self._relay_of_judge[judge] = relay
        threading.Thread(
            target=self._relay_sender, args=(relay,), daemon=True, name="kernelpro-relay"
        ).start()

    def judge_time_s(self, worker: Path) -> float:
        """Seconds the worker of `worker` has waited for the judge beside it so far."""
        relay = self._relays.get(worker)
        return relay.judge_time_s() if relay is not None else 0.0

    def judging_live_worker(self, judge: Path) -> bool:
        """Whether `judge` is the judge beside a worker that has not ended yet (its relay
        still open: `end_stream` closes it once the worker ended)."""
        with self._lock:
            relay = self._relay_of_judge.get(judge)
            return relay is not None and self._relays.get(relay.worker) is relay

    def judge_of(self, worker: Path) -> Path | None:
        """The directory of the judge checking `worker`'s outputs as they come, if any."""
        relay = self._relays.get(worker)
        return relay.judge if relay is not None else None

    def end_stream(self, worker: Path, *, judged: bool) -> None:
        """The worker ended: the judge gets the end message (`judged`: it then decides and
        times the reference) or its channel is shut (its verdict is not needed)."""
        with self._lock:
            relay = self._relays.pop(worker, None)
        if relay is None:
            return
        with relay.ready:
            relay.queue.append(({"end": True}, None) if judged else (ABORT, None))
            relay.ready.notify_all()

    def _relay_sender(self, relay: Relay) -> None:
        """Send the relay's queue to its judge, in order, once the judge's channel is open."""
        while True:
            with relay.ready:
                while not relay.queue or not (
                    relay.queue[-1][0] is ABORT
                    or relay.broken
                    or self.end_of(relay.judge) is not None
                ):
                    relay.ready.wait(0.05)
                abort = relay.queue[-1][0] is ABORT
                line, fd = (None, None) if abort else relay.queue.pop(0)
            if abort or line is None:
                self._abort(relay)
                return
            end = self.end_of(relay.judge)
            try:
                if not relay.broken and end is not None:
                    _send(end, line, fd)
            except OSError:
                self._break(relay)
            finally:
                if fd is not None:
                    os.close(fd)
            if line.get("end") is True:
                return

    def _abort(self, relay: Relay) -> None:
        with self._lock:
            relay.aborted = True
            end = self._ends.get(relay.judge)
        if end is not None:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        self._break(relay)
        with relay.ready:  # what was queued behind is not sent
            for _line, fd in relay.queue:
                if fd is not None:
                    os.close(fd)
            relay.queue.clear()

    def _break(self, relay: Relay) -> None:
        """The judge is gone: the worker waits for nothing more (and hears no refusal: the
        judge's end is the evaluation's verdict, `worker_claims.judge_end_error`)."""
        relay.broken = True
        for name in list(relay.pending):
            self._checked(relay, name)
        self._truth_found(relay, None)

    def _truth_found(self, relay: Relay, payload: Any) -> None:
        """The judge's truth (the first word only; None: it ended without one), handed to the
        worker if it is waiting for it."""
        with relay.ready:
            if relay.truth_known:
                return
            relay.truth_known = True
            relay.truth = payload if isinstance(payload, dict) else None
            wanted = relay.truth_wanted
            if wanted and not relay.pending and relay.busy_since is not None:
                relay.busy_s += time.monotonic() - relay.busy_since
                relay.busy_since = None
        if wanted:
            self._tell_truth(relay.worker, relay.truth)

    def _truth_wanted(self, workdir: Path) -> None:
        """The worker of `workdir` waits for its judge's truth: handed over now if known
        (None where no judge checks beside it), else when it comes. The wait is the judge's
        time, not the candidate's (`judge_time_s`)."""
        relay = self._relays.get(workdir)
        if relay is None:
            self._tell_truth(workdir, None)
            return
        with relay.ready:
            known = relay.truth_known
            if not known and not relay.truth_wanted:
                relay.truth_wanted = True
                if relay.busy_since is None:
                    relay.busy_since = time.monotonic()
        if known:
            self._tell_truth(workdir, relay.truth)

    def _tell_truth(self, workdir: Path, payload: dict[str, Any] | None) -> None:
        end = self.end_of(workdir)
        if end is None:
            return
        with contextlib.suppress(OSError):
            end.send(json.dumps({"truth": payload}).encode("utf-8"), socket.MSG_DONTWAIT)

    def _checked(self, relay: Relay, name: str, failed: str | None = None) -> None:
        """Output `name` was checked: its bytes leave the count, and the worker hears it, with
        the judge's reason where the judge refused it (`failed`)."""
        size = relay.pending.pop(name, None)
        if size is None:
            return
        if not relay.pending and relay.busy_since is not None:
            relay.busy_s += time.monotonic() - relay.busy_since
            relay.busy_since = None
        received = self._received.get(relay.worker)
        if received is not None:
            with received.lock:
                received.nbytes -= size
        self._tell_checked(relay.worker, name, failed)

    def _tell_checked(self, workdir: Path, name: str, failed: str | None = None) -> None:
        end = self.end_of(workdir)
        if end is None:
            return
        # Never blocks the session: a worker that does not read its channel misses the word.
        with contextlib.suppress(OSError):
            end.send(json.dumps(checked_word(name, failed)).encode("utf-8"), socket.MSG_DONTWAIT)

    def _sent(self, workdir: Path, received: Received, line: dict[str, Any]) -> None:
        """A process says output `line["sent"]` is whole: forwarded to its judge, or kept
        (and the process told at once) when none checks as it comes."""
        name, count = line.get("sent"), line.get("leaves")
        if not isinstance(name, str) or not isinstance(count, int) or isinstance(count, bool):
            raise HandleError(f"a malformed end of an output: {line!r}"[:200])
        relay = self._relays.get(workdir)
        try:
            with received.lock:
                leaves = received.outputs.get(name)
                if received.refused is None:
                    if name in received.sent:
                        raise HandleError(f"output {name} sent twice")
                    if leaves is None or sorted(leaves) != list(range(count)):
                        raise HandleError(f"output {name}: {count} leaves said, others sent")
                received.sent.add(name)
                if relay is None or relay.broken or received.refused is not None:
                    relay = None
                else:
                    received.outputs.pop(name)
        except HandleError as exc:  # refused, and answered all the same
            received.refused = received.refused or str(exc)[:300]
            relay = None
        if relay is None:
            self._tell_checked(workdir, name)
            return
        size = sum(
            nbytes_of(leaf.shape, leaf.dtype) for leaf in leaves.values() if leaf.fd is not None
        )
        with relay.ready:
            if not relay.pending:
                relay.busy_since = time.monotonic()
            relay.pending[name] = size
            for k, leaf in sorted(leaves.items()):
                relay.queue.append((leaf.line(name, k), leaf.fd))
                leaf.fd = None  # the relay's now: closed once sent
            relay.queue.append(({"sent": name, "leaves": count}, None))
            relay.ready.notify_all()

    def held_bytes(self, workdir: Path) -> int:
        """Bytes of the outputs held for the process of `workdir`: those it handed over so
        far and those forwarded to it (a judge's)."""
        received, outbox = self._received.get(workdir), self._outbox.get(workdir)
        return sum(r.nbytes for r in (received, outbox) if r is not None)

    def over_limit(self, workdir: Path) -> bool:
        """The process of `workdir` tried to hand over more than the outputs limit."""
        received = self._received.get(workdir)
        return received is not None and received.over_limit

    def _receive(self, workdir: Path, end: socket.socket, received: Received) -> None:
        leaves = 0
        reset = False
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(end, MAX_MESSAGE + 1, 4)
            except ConnectionResetError:
                # A process that exits with a message of ours unread in its end (a word it
                # never awaited) makes Linux fail one read with ECONNRESET, ahead of what it
                # sent before exiting: those messages are still queued and read next. Once:
                # the error is reported a single time per close.
                if reset:
                    break
                reset = True
                continue
            except OSError:
                break
            if not data and not fds:
                break  # the process closed its end (exited)
            try:
                line = json.loads(data.decode("utf-8"))
                if isinstance(line, dict) and "checked" in line and not fds:
                    judging = self._relay_of_judge.get(workdir)  # only a judge's word counts
                    if judging is not None and isinstance(line["checked"], str):
                        failed = line.get("failed")
                        self._checked(
                            judging, line["checked"], failed if isinstance(failed, str) else None
                        )
                    continue
                if isinstance(line, dict) and "sent" in line and not fds:
                    self._sent(workdir, received, line)  # answered even once refused
                    continue
                if isinstance(line, dict) and "truth" in line and not fds:
                    judging = self._relay_of_judge.get(workdir)  # only a judge's truth counts
                    if judging is not None:
                        self._truth_found(judging, line["truth"])
                    continue
                if isinstance(line, dict) and line.get("await") == "truth" and not fds:
                    self._truth_wanted(workdir)
                    continue
                if received.refused is not None:
                    continue
                leaves += 1
                if leaves > MAX_LEAVES:
                    raise HandleError(f"more than {MAX_LEAVES} leaves")
                output, k, leaf = validate(line, fds)
                size = nbytes_of(leaf.shape, leaf.dtype) if leaf.fd is not None else 0
                with received.lock:
                    if received.nbytes + size > self.limit_bytes:
                        received.over_limit = True
                        raise HandleError(
                            f"the checked outputs take more than {self.limit_bytes / 2**20:.0f} MB "
                            "(SandboxLimits.outputs_limit_mb)"
                        )
                    if output in received.sent:
                        raise HandleError(f"output {output} leaf {k} sent after its end")
                    slot = received.outputs.setdefault(output, {})
                    if k in slot:
                        raise HandleError(f"output {output} leaf {k} sent twice")
                    slot[k] = leaf
                    received.nbytes += size
                    received.peak_nbytes = max(received.peak_nbytes, received.nbytes)
                    fds = []  # kept
            except (HandleError, ValueError, OSError) as exc:
                received.refused = received.refused or str(exc)[:300]
            finally:
                for fd in fds:
                    os.close(fd)
        judging = self._relay_of_judge.get(workdir)
        if judging is not None:  # a judge that ended checks nothing more
            self._break(judging)

    def finish(self, workdir: Path) -> Received:
        """What the (ended) process of `workdir` sent; the channel is closed."""
        with self._lock:
            end = self._ends.pop(workdir, None)
            thread = self._threads.pop(workdir, None)
            received = self._received.pop(workdir, None) or Received()
            self._outbox.pop(workdir, None)
            judging = self._relay_of_judge.pop(workdir, None)
        if judging is not None:  # a judge that ended checks nothing more
            self._break(judging)
        if end is not None:
            # The process ended: its queued messages are read, then the end of the stream.
            # A descriptor of it still open elsewhere (a child that escaped the fallback's
            # process group) must not hold the evaluation: the channel is shut after a wait.
            if thread is not None:
                thread.join(timeout=FINISH_WAIT_S)
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            if thread is not None:
                thread.join()
            end.close()
        return received

    def end_of(self, workdir: Path) -> socket.socket | None:
        with self._lock:
            return self._ends.get(workdir)

    def close(self) -> None:
        with self._lock:
            workdirs = list(self._ends)
            streamed = list(self._relays)
        for worker in streamed:  # never ended (an evaluation that failed): its sender stops
            self.end_stream(worker, judged=False)
        for workdir in workdirs:
            self.finish(workdir).close()


def _close_ends(ends: dict[Path, socket.socket]) -> None:
    for end in list(ends.values()):
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)
        end.close()


def send_outputs(end: socket.socket, received: Received) -> None:
    """Forward `received`'s outputs to a judge over its channel, then the end message."""
    with received.lock:
        lines: list[tuple[dict[str, Any], int | None]] = []
        for output, leaves in received.outputs.items():
            lines += [(leaf.line(output, k), leaf.fd) for k, leaf in sorted(leaves.items())]
            lines.append(({"sent": output, "leaves": len(leaves)}, None))
    for line, fd in lines:
        _send(end, line, fd)
    _send(end, {"end": True}, None)


def _start_sending(end: socket.socket, outputs: Received) -> None:
    """`send_outputs` on a thread: the judge reads while the session watches it, so a
    channel full of messages waits for the judge instead of the session."""

    def send() -> None:
        with contextlib.suppress(OSError, HandleError):  # the judge died: its verdict says so
            send_outputs(end, outputs)
        # Sent or not (a judge that died has nothing to check): no longer the session's.
        outputs.handed_on()

    threading.Thread(target=send, daemon=True, name="kernelpro-handles-send").start()


# ----- the judge: the outputs in -----


def stream_outputs(
    torch: Any,
    channel: socket.socket | None = None,
    *,
    acknowledge: bool = False,
    failures: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, list[Any]]]:
    """Each output the session forwards to this judge over `channel` (this process's channel
    when None), as (name, leaves: tensors mapped privately from their sealed memfds, plain
    values), as soon as it is whole (`{"sent": NAME}`); ends at the end message.

    `acknowledge`: when the caller asks for the next output, this one's leaves are dropped
    here and `{"checked": NAME}` goes to the session, so the worker waiting for it
    (`await_checked`) makes its next output only once the caller holds no reference to this
    one. With the caller's reason where it refused the output (`failures[NAME]`, set before
    it asks for the next): the worker, which makes no comparison of its own for a call the
    judge decides (`harness._Pipeline.judge_decides`), stops at that call with that reason."""
    channel = channel or _process_socket()
    if channel is None:
        raise HandleError(f"no handle channel in this process (${HANDLE_FD_ENV} unset)")
    found: dict[str, dict[int, Any]] = {}
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE + 1, 4)
        except OSError as exc:
            raise HandleError(f"the session closed the channel ({exc})") from None
        if not data:
            raise HandleError("the session closed the channel before the end message")
        try:
            line = json.loads(data.decode("utf-8"))
            if isinstance(line, dict) and line.get("end") is True:
                break
            if isinstance(line, dict) and "sent" in line:
                name = str(line["sent"])
                leaves = found.pop(name, {})
                whole = [leaves.pop(k) for k in sorted(leaves)]
                del leaves
                yield name, whole
                del whole
                if acknowledge:
                    release_freed_heap()  # the worker's memory is in use next
                    failed = failures.get(name) if failures is not None else None
                    try:
                        _send(channel, checked_word(name, failed), None)
                    except OSError as exc:  # shut by the session: no verdict is wanted
                        raise HandleError(f"the session closed the channel ({exc})") from None
                continue
            output, k, leaf = validate(line, fds)
            found.setdefault(output, {})[k] = _mapped(torch, leaf)
        finally:
            for fd in fds:
                os.close(fd)
    for name in list(found):  # never said whole: handed on as they are
        leaves = found.pop(name)
        yield name, [leaves[k] for k in sorted(leaves)]


def receive_outputs(torch: Any, channel: socket.socket | None = None) -> dict[str, list[Any]]:
    """Every output the session forwards to this judge (`stream_outputs`), by name."""
    return dict(stream_outputs(torch, channel))


def _mapped(torch: Any, leaf: Leaf) -> Any:
    if leaf.kind == "value":
        return leaf.value
    dtype = getattr(torch, leaf.dtype)
    if leaf.fd is None:
        return torch.empty(leaf.shape, dtype=dtype)
    numel = 1
    for n in leaf.shape:
        numel *= n
    # A private mapping (the memfd is write-sealed): the judge reads the pages, never shares
    # a write; the mapping keeps the memory alive after the descriptor is closed.
    return torch.from_file(f"/proc/self/fd/{leaf.fd}", shared=False, size=numel, dtype=dtype).view(
        leaf.shape
    )
