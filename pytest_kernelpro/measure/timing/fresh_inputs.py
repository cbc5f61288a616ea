"""Fresh data for every timed call, plain outputs, and outputs of timed calls checked.

The timer calls a kernel thousands of times on one set of inputs. A kernel can exploit that:
memoise its result by the tensors' identity and `_version`, return `torch.empty` when the same
tensors come back, or return a tensor subclass that computes only when read. `FreshInputs` is
what the timers call instead of the bare kernel:

- before every timed call (outside the timed region: before the cache flush and the start
  marker) the timed tensors are refilled in place with the next of two content sets made by
  the problem's own input factory (two seeds), so no two consecutive calls see the same
  contents, and every call sees a new `_version`;
- every output is checked to be exactly `torch.Tensor` (not a subclass or wrapper) with real
  storage (`plain_output_problem`);
- a random sample of timed calls (the first two always, then about one in `SAMPLE_ONE_IN`, at most
  `MAX_SNAPSHOTS`) has its output copied right after the call's end marker, on the timed
  stream, and the copies are compared with the reference's output for the same contents when
  the timing ends: a memo, garbage on repeat, or work finishing after the call returned fails.

The two content sets, the reference's two outputs and the snapshots cost memory: at most
`MEMORY_SHARE` of the memory free on the device (CUDA: `mem_get_info`; CPU: MemAvailable). When
they do not fit, the ring is left out (the same contents, the `_version` still bumped every
call) and, if even the outputs do not fit, the outputs are not checked either; the timing's
`fresh_inputs` note says which.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure import bound

MEMORY_SHARE = 0.25  # the ring, the reference outputs and the snapshots: at most this share
MAX_SNAPSHOTS = 3  # outputs of timed calls kept for the comparison at the end
SAMPLE_ONE_IN = 8  # about one timed call in this many is snapshot (while room is left)
CONTENT_SEED_OFFSET = 7_919  # the second content set's seed: the timed inputs' seed + this


class DishonestTiming(KernelproError):
    """A timed call did less than the work it claims (the message says what was seen)."""


def _tensor_leaves(torch: Any, obj: Any) -> list[Any]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [leaf for item in obj for leaf in _tensor_leaves(torch, item)]
    if isinstance(obj, dict):
        return [leaf for item in obj.values() for leaf in _tensor_leaves(torch, item)]
    return []


def _leaves(obj: Any, path: str = "output") -> list[tuple[str, Any]]:
    if isinstance(obj, (list, tuple)):
        return [pair for i, item in enumerate(obj) for pair in _leaves(item, f"{path}[{i}]")]
    if isinstance(obj, dict):
        return [pair for k, item in obj.items() for pair in _leaves(item, f"{path}[{k!r}]")]
    return [(path, obj)]


def plain_output_problem(torch: Any, out: Any) -> str | None:
    """Why `out` is not a plain result, or None: every tensor-like leaf must be exactly
    `torch.Tensor` with storage of its own (not a subclass, wrapper or meta tensor)."""
    for path, leaf in _leaves(out):
        kind = type(leaf)
        tensor_like = isinstance(leaf, torch.Tensor) or hasattr(kind, "__torch_function__")
        if not tensor_like:
            continue
        name = f"{kind.__module__}.{kind.__qualname__}"
        if kind is not torch.Tensor:
            return (
                f"{path} is a {name}, not a plain torch.Tensor: a tensor subclass or wrapper "
                "(for example a lazy tensor that computes when read) can move work out of the "
                "timed call. Return a torch.Tensor (e.g. torch.Tensor(result) or "
                "result.as_subclass(torch.Tensor) after computing it)"
            )
        if leaf.is_meta:
            return f"{path} is a meta tensor (no data): return the computed tensor"
        try:
            leaf.untyped_storage()
        except (RuntimeError, NotImplementedError) as exc:
            return f"{path} has no storage of its own ({type(exc).__name__}: {exc})"
    return None


def free_memory_bytes(torch: Any, device: str) -> int | None:
    """Bytes free on `device` now (CUDA: the driver's count; CPU: MemAvailable), or None."""
    if device.startswith("cuda"):
        try:
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except Exception:
            return None
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _nbytes(torch: Any, obj: Any) -> int:
    return sum(int(t.numel()) * int(t.element_size()) for t in _tensor_leaves(torch, obj))


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


@dataclass
class FreshInputs:
    """The timed call with fresh inputs and checked outputs (see the module docstring)."""

    torch: Any
    kernel: Callable[..., Any]
    storage: Sequence[Any]  # the timed inputs: refilled in place before every call
    contents: list[Any] = field(default_factory=list)  # content sets copied in, in turn
    expected: list[Any] | None = None  # the reference's output for each content set
    check: Callable[[Any, Any], str | None] | None = None  # failure text of got vs expected
    note: str = ""
    _current: int = 0  # the content set the timed tensors hold now (set 0: their own)
    _calls: int = 0
    # Host seconds spent refilling inputs (enqueueing, on a GPU) and checking the snapshots:
    # what this costs a timing (the record's `timing.honesty`).
    refill_s: float = 0.0
    check_s: float = 0.0
    _snapshots: list[tuple[int, int, Any]] = field(default_factory=list)
    _rng: random.Random = field(default_factory=lambda: random.Random(os.urandom(16)))

    def before(self) -> None:
        """Refill the timed inputs with the next content set (outside the timed region)."""
        started = bound.perf_counter()
        try:
            self._refill()
        finally:
            self.refill_s += bound.perf_counter() - started

    def _refill(self) -> None:
        targets = _tensor_leaves(self.torch, self.storage)
        if len(self.contents) >= 2:
            self._current = (self._current + 1) % len(self.contents)
            source = _tensor_leaves(self.torch, self.contents[self._current])
            with self.torch.no_grad():  # an input that requires grad is refilled all the same
                for dst, src in zip(targets, source, strict=True):
                    dst.copy_(src)
            return
        bump = self.torch.autograd.graph.increment_version
        for dst in targets:
            bump(dst)

    def resume(self) -> None:
        """Before a later timing of the same tensors: something else wrote into them since
        (the post-timing re-check writes new contents in place), so a checked call would be
        compared with the reference's output for contents it never saw. With a ring, the
        current set is copied back; without one the expected output is lost with the
        contents, and the re-measurement's outputs are checked for plainness only (noted)."""
        if len(self.contents) >= 2:
            source = _tensor_leaves(self.torch, self.contents[self._current])
            with self.torch.no_grad():
                for dst, src in zip(_tensor_leaves(self.torch, self.storage), source, strict=True):
                    dst.copy_(src)
            return
        if self.expected is not None:
            self.expected = None
            self.note += (
                "; a re-measurement after the post-timing re-check does not compare outputs "
                "(the re-check replaced the only content set)"
            )

    def call(self) -> Any:
        return self.kernel(*self.storage)

    def after(self, out: Any, *, force: bool = False) -> None:
        """Check one timed call's output: plain, and sometimes copied for `finish`."""
        self._calls += 1
        problem = plain_output_problem(self.torch, out)
        if problem is not None:
            raise DishonestTiming(problem)
        if self.expected is None or len(self._snapshots) >= MAX_SNAPSHOTS:
            return
        # The first two calls always: a kernel that cheats from its first repeated call on
        # is caught for certain; later ones at random (a cheat cannot tell which).
        if force or self._calls <= 2 or self._rng.randrange(SAMPLE_ONE_IN) == 0:
            snap = _clone(self.torch, out)
            self._snapshots.append((self._calls, self._current, snap))

    def finish(self) -> None:
        """Compare the snapshots with the reference; raises `DishonestTiming` naming the
        first wrong one. Snapshots are dropped either way (a re-measurement takes new ones)."""
        snapshots, self._snapshots = self._snapshots, []
        if self.expected is None or self.check is None:
            return
        for number, turn, snap in snapshots:
            started = bound.perf_counter()
            failure = self.check(snap, self.expected[turn])
            self.check_s += bound.perf_counter() - started
            if failure is not None:
                raise DishonestTiming(
                    f"timed call {number} returned a wrong output ({failure}), read on the timed "
                    "stream right after the call: its result was cached from other inputs, left "
                    "uncomputed on repeated inputs, or computed after the call returned (on "
                    "another stream or thread). Every timed call must do the whole work"
                )

    def to_dict(self) -> dict[str, Any]:
        return {
            "content_sets": len(self.contents),
            "outputs_checked": self.expected is not None,
            "note": self.note,
            "refill_s": round(self.refill_s, 6),
            "check_s": round(self.check_s, 6),
        }


def _clone(torch: Any, obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(torch, x) for x in obj) if not hasattr(obj, "_fields") else obj
    if isinstance(obj, dict):
        return {k: _clone(torch, v) for k, v in obj.items()}
    return obj


def _same_contents(torch: Any, a: Any, b: Any) -> bool:
    left, right = _tensor_leaves(torch, a), _tensor_leaves(torch, b)
    return len(left) == len(right) and all(
        x.shape == y.shape and x.dtype == y.dtype and bool(torch.equal(x, y))
        for x, y in zip(left, right, strict=True)
    )


def fresh_inputs(
    torch: Any,
    kernel: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    device: str,
    make_second: Callable[[], Sequence[Any]] | None,
    reference: Callable[..., Any] | None,
    check: Callable[[Any, Any], str | None] | None,
    free_bytes: int | None = None,
) -> FreshInputs:
    """The `FreshInputs` of `kernel` on the timed `inputs`: a ring of the inputs' own contents
    and `make_second()`'s when they fit in `MEMORY_SHARE` of the free memory (see the module
    docstring), the reference's outputs for both when `reference` and `check` are given."""
    fresh = FreshInputs(torch, kernel, inputs, check=check)
    if not _tensor_leaves(torch, inputs):
        fresh.note = "fresh inputs: none to refresh (no tensor inputs)"
        return fresh
    free = free_memory_bytes(torch, device) if free_bytes is None else free_bytes
    room = None if free is None else MEMORY_SHARE * free
    in_bytes = _nbytes(torch, inputs)
    first = _clone(torch, inputs)
    expected0 = None
    out_bytes = 0
    if reference is not None and check is not None:
        expected0 = reference(*_clone(torch, first))
        out_bytes = _nbytes(torch, expected0)
    ring_need = 2 * in_bytes + (2 + MAX_SNAPSHOTS) * out_bytes
    check_need = in_bytes + (1 + MAX_SNAPSHOTS) * out_bytes
    if room is None or ring_need <= room:
        second = make_second() if make_second is not None else None
        same = second is not None and _same_contents(torch, inputs, second)
        if same:
            fresh.note = (
                "fresh inputs: off (the input maker returned the same contents for another seed: "
                "make it draw from torch's seeded RNG or its generator= argument): every call "
                "sees the same contents with a new _version; "
            )
        elif second is not None and len(_tensor_leaves(torch, second)) == len(
            _tensor_leaves(torch, inputs)
        ):
            fresh.contents = [first, list(second)]
            if expected0 is not None and reference is not None:
                fresh.expected = [expected0, reference(*_clone(torch, second))]
            fresh.note = (
                f"fresh inputs: 2 content sets refilled in turn ({_mib(2 * in_bytes)} of inputs"
                + (
                    f", {_mib((2 + MAX_SNAPSHOTS) * out_bytes)} of outputs checked"
                    if expected0 is not None
                    else ""
                )  # fmt: skip
                + ")"
            )
            return fresh
    del first
    limit = "unknown" if room is None else _mib(room)
    if fresh.note:  # the same contents: the outputs are still checked
        fresh.expected = None if expected0 is None else [expected0]
        fresh.note += (
            "sampled outputs are " + ("still" if expected0 is not None else "not") + " checked"
        )
        return fresh
    if expected0 is not None and (room is None or check_need <= room):
        fresh.contents = []
        fresh.expected = [expected0]
        fresh.note = (
            f"fresh inputs: off (a second input set and its outputs need {_mib(ring_need)}, more "
            f"than {MEMORY_SHARE:.0%} of the free memory, {limit}): every call sees the same "
            "contents with a new _version; sampled outputs are still checked"
        )
        return fresh
    fresh.note = (
        f"fresh inputs: off (a second input set needs {_mib(ring_need)}, more than "
        f"{MEMORY_SHARE:.0%} of the free memory, {limit}): every call sees the same contents with "
        "a new _version; timed outputs are not checked"
    )
    return fresh
