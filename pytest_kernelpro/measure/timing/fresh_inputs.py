"""Content no timed call has seen before, outputs checked at calls no kernel can predict.

A timed kernel could memoise by the tensors' identity, `_version` or sampled values, return
`torch.empty` on repeated inputs, compute only on checked calls, or return a lazy tensor
subclass. `FreshInputs` is what the timers call instead.

**New content every call**, made in place before the call (outside the timed region), by
`mode` (in the record):
- `mix` (default): per element A + U (B - A), A a draw of the input maker, B that draw rolled
  by half its first dimension (views of A, per chunk; a leaf whose roll is itself keeps a
  second draw; no maker: B = A (1 + JITTER V)), U a window at an `os.urandom` offset never used
  before of a pool of byte weights k / `WEIGHT_LEVELS` (`FreshInputs.before`); integers and
  booleans take A or B per element. Elements stay in the draw's range and U has as many random
  values as the inputs: a memo keyed by a few values hits only where the rest of the content
  differs (its check refuses the output).
- `maker`: a new draw per call, seeded from `os.urandom`, where a mixed input is not valid
  (kernel and reference disagree, or the reference stops being finite) or does not fit.
- `fixed`: the same contents with a new `_version`, every output checked; `inputs_fixed`
  names the kernel and what to change.

**Checks the kernel cannot predict.** After each call returns, `CHECK_RATE` against
`os.urandom` read then decides whether it is checked (`after`); the output is copied at once
and compared with the reference on that call's content, on the CPU at once, on a GPU after the
round (`drain`), never in a timed region. A kernel skipping a share f of n calls survives with
probability (1 - CHECK_RATE f)^n. The timer's state is sealed (`Seal`, `queue_tampering`,
`kept_content`), the timed tensors' layout compared after every call (`REPOINTED`), and
outputs must be plain `torch.Tensor`s with storage (`plain_output_problem`).

**Memory** (I: one call's inputs, O: its output): the timed inputs, A and the byte pools,
2I + I/4 for float32 (a kept B adds its leaves); a checked call adds the output's copy and the
reference's output (2O); the setup 3I while a second draw tells the inputs regenerate, then
2I + I/4 + 2O; a copy apart (`_apart`) adds I. The mix must fit `MEMORY_SHARE` of the free
memory, else `maker`. Measured by `bench/fresh_inputs_memory.py`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, is_not, methodcaller
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure import bound
from pytest_kernelpro.measure.output_rule import clone_inputs, leaves_of, map_tensors, tensor_leaves

MEMORY_SHARE = 0.25  # A, B, U and the checked outputs: at most this share of the free memory
# Share of timed calls checked: skipping half of 21 calls (the minimum timing) survives with
# (1 - 0.6 * 0.5) ** 21 = 0.00056.
CHECK_RATE = 0.6
FIXED_CHECK_RATE = 1.0  # inputs that cannot change: every call checked (the strongest left)
JITTER = 0.125  # one draw only: the second end of the mix is A * (1 + JITTER * V), V in [0, 1)
# A window of a pool instead of a new U per call: one `lerp`, a 35th of drawing U
# (bench/results/2026-12-05-fresh-content-cpu.md).
WINDOW = 2**20  # offsets per pool; an offset is never used twice
# The pools hold one byte a weight, k / WEIGHT_LEVELS with k uniform in [0, 256): a quarter of
# a float32 input's size instead of all of it. They are converted, CHUNK elements at a time,
# straight into the timed tensors (no temporary of the input's size).
WEIGHT_LEVELS = 256
CHUNK = 2**20  # on the CPU: a chunk's three passes stay in the cache
DEVICE_CHUNK = 2**24  # on a GPU: fewer launches (the verification's temporary is a chunk)
PENDING_CHECKS = 64  # GPU: the timer compares its queued checked copies beyond this many
PENDING_BYTES = 2**28  # GPU: or once they hold this many bytes (device memory, `queued_bytes`)
# A queued check: the call's number, the mix's offset and what else names the content (the
# maker's draw, or the fixed content's copy).
CheckKey = tuple[int, int, Any]
REDRAW = "drawn again from its seed"  # a repeating maker's content: its draw is not kept


class DishonestTiming(KernelproError):
    """A timed call did less than the work it claims (the message says what was seen)."""


# What every refusal of a changed timer state says.
REWRITES_TIMER = (
    "a kernel that rewrites the timer's objects (found on the call stack or through gc) "
    "cannot be timed"
)


def verify_bindings(fresh: FreshInputs | None = None, seal: Seal | None = None) -> None:
    """Raise `DishonestTiming` when a kept binding was rebound (`measure.bound`) or `fresh`
    no longer matches its `seal`; the timers call this around every sample."""
    if bound.intact(*(seal.kept if seal is not None and fresh is not None else ())):
        return  # the per-sample path: a few comparisons run in C, nothing named
    failure = bound.binding_failure("while the kernel was timed")
    if failure is not None:
        bound.restore()
        raise DishonestTiming(failure)
    if fresh is not None and seal is not None:
        changed = seal.changed(fresh)
        if changed:
            raise DishonestTiming(
                f"the timer's own state ({', '.join(changed)} of its fresh inputs) was changed "
                f"while the kernel was timed: {REWRITES_TIMER}"
            )


def _same_objects(left: Sequence[Any], right: Sequence[Any]) -> bool:
    """The same objects in the same order (compared in C)."""
    return len(left) == len(right) and not any(map(is_not, left, right))


def queue_tampering(queued: Sequence[CheckKey], found: Sequence[Any]) -> str | None:
    """What was done to the queue of deferred checks, or None: `found` must be the very
    keys `after` returned (`queued`), in order."""
    if _same_objects(found, queued):
        return None
    if len(found) < len(queued):
        what = f"emptied or shortened ({len(queued)} checks queued, {len(found)} left)"
    elif len(found) > len(queued):
        what = f"added to ({len(found) - len(queued)} entries no timed call queued)"
    else:
        what = "edited (an entry replaced: its call, its content's offset or its draw)"
    return (
        f"the timer's queue of deferred output checks was {what} while the kernel was timed: "
        "checks decided after the calls returned would have been skipped or compared on other "
        f"content: {REWRITES_TIMER}"
    )


# What a kernel could rewrite on the timer's `FreshInputs` to see old content or no checks.
SEALED = tuple(
    "torch mode ends weights make_draw reference check kernel storage defer _pending _plan "
    "_targets _layout _storages _flat _used maker_repeats".split()
)


@dataclass(frozen=True)
class Seal:
    """`FreshInputs`' state as the timing started, a local of the timer's frame: `kept`, the
    `bound.Kept` groups `bound.intact` checks every sample (the sealed names' objects, the
    namespace, no method shadowed); `changed` names what differs."""

    values: tuple[Any, ...]
    weights: tuple[Any, ...]
    ends_a: tuple[Any, ...]
    ends_b: tuple[Any, ...]
    kept: tuple[bound.Kept, ...]

    @classmethod
    def of(cls, fresh: FreshInputs) -> Seal:
        fresh.prepare()
        a, b = fresh.ends if fresh.ends is not None else ((), ())
        values = attrgetter(*SEALED)(fresh)
        names = bound.Kept(by_dict=False)
        names.extend([("fresh inputs", fresh, n, v) for n, v in zip(SEALED, values, strict=True)])
        namespace = vars(fresh)
        names.add("fresh inputs", fresh, "__dict__", namespace)
        methods = bound.Kept(by_dict=True)
        methods.absent("fresh inputs", namespace, SHADOWING)
        return cls(values, tuple(fresh.weights), tuple(a), tuple(b), (names, methods))

    def changed(self, fresh: FreshInputs) -> list[str]:
        found = [
            name
            for name, value in zip(SEALED, self.values, strict=True)
            if getattr(fresh, name, None) is not value
        ]
        a, b = fresh.ends if fresh.ends is not None else ((), ())
        if not (
            _same_objects(fresh.weights, self.weights)
            and _same_objects(a, self.ends_a)
            and _same_objects(b, self.ends_b)
        ):
            found.append("its mixed content's tensors")
        if self.kept and vars(fresh) is not self.kept[0].values[-1]:
            found.append("its namespace (replaced)")
        shadowed = sorted(SHADOWING.intersection(vars(fresh)))
        return found + [f"{name} (set on the object)" for name in shadowed]


_DATA_PTR, _STRIDE = methodcaller("data_ptr"), methodcaller("stride")
_SHAPE, _DTYPE = attrgetter("shape"), attrgetter("dtype")
REPOINTED = (
    "the kernel re-pointed a timed input (`set_`, `.data =`, `resize_` or `as_strided_`: its "
    "address, strides, shape or dtype changed): the timer refills the tensors it was given, "
    "so every later call could read content of the kernel's own choosing. A kernel may write "
    "its inputs, never re-point them"
)


def _layout(targets: Sequence[Any]) -> tuple[Any, ...]:
    """Where and how each timed tensor reads its elements: (address, strides, shape, dtype)
    per tensor, read in C, no comprehension (`FreshInputs.after` compares it every call, in
    this expression inline)."""
    parts = map(_DATA_PTR, targets), map(_STRIDE, targets), map(_SHAPE, targets)
    return tuple(zip(*parts, map(_DTYPE, targets), strict=True))


KEPT_POSITIONS = 4096  # per kept tensor, fingerprinting the mix's content (`kept_content`)
# A new pool's fingerprint must hold at least this share of the old one's distinct values.
POOL_VARIETY = 0.9
POOL_RUN = 4  # consecutive byte weights a pool's fingerprint reads as one value
KEPT_CHANGED = (
    "the kernel rewrote the timer's kept content (the ends or the pools of uniform values its "
    "fresh inputs are mixed from, found through gc): every call's content and every check's "
    "rebuilt content would be the same"
)


def kept_content(fresh: FreshInputs, seed: int) -> tuple[bytes, ...]:
    """The mix's ends' and pools' values at `KEPT_POSITIONS` positions chosen by `seed`, as
    bytes the caller keeps in its frame for `kept_content_changed`."""
    if fresh.mode != "mix" or fresh.ends is None:
        return ()
    torch = fresh.torch
    gen = torch.Generator().manual_seed(seed)
    out = []
    ends = (*fresh.ends[0], *fresh.ends[1])
    with torch.no_grad():
        for index, tensor in enumerate((*ends, *fresh.weights)):
            flat = tensor.reshape(-1)
            if flat.numel() == 0:  # an empty input holds nothing to rewrite
                out.append(b"")
                continue
            # A pool's byte weights read POOL_RUN at a time as one number: its variety is
            # that of runs of weights, so a short repeated pattern of bytes is not "varied".
            run = 1 if index < len(ends) else POOL_RUN
            room = max(1, int(flat.numel()) - run + 1)
            count = min(KEPT_POSITIONS, room)
            where = torch.randint(0, room, (count,), generator=gen).to(flat.device)
            values = flat[where].to(torch.float64)
            for step in range(1, run):
                values = values * WEIGHT_LEVELS + flat[where + step].to(torch.float64)
            out.append(values.cpu().numpy().tobytes())
    return tuple(out)


def kept_content_changed(fresh: FreshInputs, seed: int, kept: tuple[bytes, ...]) -> bool:
    """Whether the kept content differs from `kept`: the ends must not change; a pool only
    to values as varied (a new pool), never a constant or a short pattern."""
    now = kept_content(fresh, seed)
    if len(now) != len(kept):
        return True
    ends = 2 * len(fresh.ends[0]) if fresh.ends is not None else 0
    for index, (before, after) in enumerate(zip(kept, now, strict=True)):
        if before == after:
            continue
        if index < ends:
            return True
        varied = len(set(memoryview(after).cast("d")))
        if varied < POOL_VARIETY * len(set(memoryview(before).cast("d"))):
            return True
    return False


def _with_leaves(torch: Any, obj: Any, leaves: list[Any]) -> Any:
    """`obj` with its tensor leaves replaced, in order, by `leaves`."""
    found = iter(leaves)
    return map_tensors(torch, obj, lambda _tensor: next(found))


def plain_output_problem(torch: Any, out: Any) -> str | None:
    """Why `out` is not a plain result, or None: every tensor-like leaf must be exactly a
    `torch.Tensor` with storage of its own."""
    for path, leaf in leaves_of(torch, out):
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
            found = [line.split()[1] for line in handle if line.startswith("MemAvailable:")]
        return int(found[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None


def _nbytes(torch: Any, obj: Any) -> int:
    return sum([int(t.numel()) * int(t.element_size()) for t in tensor_leaves(torch, obj)])


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def _urandom_seed() -> int:
    return int.from_bytes(bound.os_urandom(8), "little") & (2**63 - 1)


def survival(rate: float, skipped_share: float, calls: int) -> float:
    """Probability that a kernel skipping `skipped_share` of `calls` is never checked on one."""
    return (1.0 - rate * skipped_share) ** calls


def _mixable(torch: Any, tensor: Any) -> bool:
    return bool(tensor.is_floating_point()) and tensor.dtype not in (
        getattr(torch, "float8_e4m3fn", None),
        getattr(torch, "float8_e5m2", None),
    )


@dataclass
class FreshInputs:
    """The timed call with new content every call and unpredictable checks (module docstring)."""

    torch: Any
    kernel: Callable[..., Any]
    storage: Sequence[Any]  # the timed inputs: refilled in place before every call
    name: str = "the kernel"
    mode: str = "fixed"  # "mix" | "maker" | "fixed" | "none" (no tensor inputs)
    ends: tuple[Sequence[Any], Sequence[Any]] | None = None  # mix: the leaves of A and B
    weights: Sequence[Any] = field(default_factory=list)  # mix: a pool per leaf (`_offset`)
    _offset: int = 0
    _used: set[int] = field(default_factory=set)  # offsets of earlier calls: never again
    make_draw: Callable[[int], Sequence[Any]] | None = None  # maker: a new draw per call
    # maker: a seed repeats its draw, so a check draws again from the seed (`_offset`) and no
    # draw is kept past its copy into the timed inputs (`REDRAW`): none a kernel could rewrite.
    maker_repeats: bool = False
    reference: Callable[..., Any] | None = None
    check: Callable[[Any, Any], str | None] | None = None  # failure text of got vs expected
    defer: bool = False  # GPU: checked copies queued, compared by `drain`
    note: str = ""
    inputs_fixed: str = ""  # why the inputs cannot be regenerated and what to change, or ""
    # Host seconds making content and checking (the record's `timing.honesty`), never timed.
    refill_s: float = 0.0
    refills: int = 0
    check_s: float = 0.0
    checked: int = 0
    _calls: int = 0
    _draw: Any = None  # maker: the current call's content
    _pending: list[tuple[CheckKey, Any]] = field(default_factory=list)  # (key, copied output)
    # By `prepare`: the mix's chunks of every timed leaf (`Step`, () when not mixed), and
    # whether the inputs are a flat sequence of tensors.
    _plan: tuple[Step, ...] | None = None
    _targets: tuple[Any, ...] = ()
    _layout: tuple[Any, ...] = ()  # by `prepare`: `_layout` of `_targets`, checked every call
    _storages: frozenset[int] = frozenset()  # their storages' addresses (fixed with `_layout`)
    _flat: bool = False
    # A check's content rebuilt into a copy apart (`content`, held by the timer only), not the
    # timed tensors: set for good once they lost the rebuilt content while the reference ran.
    _apart: bool = False

    @property
    def rate(self) -> float:
        """The share of calls checked: a kept module constant, no state a kernel could lower."""
        return FIXED_CHECK_RATE if self.mode == "fixed" else CHECK_RATE

    def seal(self) -> Seal:
        return Seal.of(self)

    @property
    def outputs_checked(self) -> bool:
        return self.reference is not None and self.check is not None

    def prepare(self) -> tuple[Step, ...]:
        """The per-call plan, made once, that refills and contents walk."""
        if self._plan is not None:
            return self._plan
        torch = self.torch
        # Tuples from here (sealed by identity: no tensor of them replaced in place).
        self.storage = tuple(self.storage)
        self.weights = tuple(self.weights)
        if self.ends is not None:
            self.ends = (tuple(self.ends[0]), tuple(self.ends[1]))
        self._targets = tuple(tensor_leaves(torch, self.storage))
        self._layout = _layout(self._targets)
        self._storages = frozenset([int(t.untyped_storage().data_ptr()) for t in self._targets])
        self._flat = all([isinstance(x, torch.Tensor) for x in self.storage])
        if self.mode == "mix" and self.ends is not None:
            steps = []
            for t, a, b, pool in zip(self._targets, *self.ends, self.weights, strict=True):
                steps.extend(_steps(torch, t, a, b, pool))
            self._plan = tuple(steps)
        else:
            self._plan = ()
        return self._plan

    def before(
        self,
        offset: int | None = None,
        steps: Sequence[Step] | None = None,
        expected: bool = False,
    ) -> Any:
        """Give the timed inputs content no earlier call held (the mix's one home: module
        docstring), in place, without grad; returns what names it (offset, draw) for `after`.
        Given an `offset`, that content is made again in `steps` (default: the timed tensors');
        with `expected` (`expected_on`), the reference runs on them, each chunk is made again
        apart and compared with `dst` bit for bit (NaN payloads included), and the reference's
        output is returned. One frame: it runs before every timed call."""
        torch = self.torch
        new = offset is None
        started = bound.perf_counter()
        try:
            with torch.no_grad():
                plan = self._plan if self._plan is not None else self.prepare()
                if new and plan:
                    used = self._used
                    offset = int.from_bytes(bound.os_urandom(8), "little") % WINDOW
                    if offset in used or len(used) >= WINDOW // 2:
                        offset = self._new_offset()
                    else:
                        used.add(offset)
                    self._offset = offset
                elif new and self.mode == "maker" and self.make_draw is not None:
                    self._offset = seed = _urandom_seed()  # the token's first half: the seed
                    self._draw = self.make_draw(seed)
                    leaves = tensor_leaves(torch, self._draw)
                    for dst, src in zip(self._targets, leaves, strict=True):
                        dst.copy_(src)
                    self._draw = REDRAW if self.maker_repeats else self._draw
                    return self._offset, self._draw
                elif new:
                    bump = torch.autograd.graph.increment_version
                    for dst in self._targets:
                        bump(dst)
                    return self._offset, self._draw
                assert offset is not None
                if expected and self._apart:
                    return self.reference(*self.content(offset))
                result = None
                for verify in (False, True) if expected else (False,):
                    if verify and self.reference is not None:
                        args = self.storage if self._flat else self._arguments()
                        result = self.reference(*args)
                        args = None
                    for dst, a, b, pool, start, end, shape, mixed in (
                        plan if steps is None else steps
                    ):
                        weights = pool[offset + start : offset + end]
                        if shape is not None:
                            weights = weights.view(shape)
                        into = torch.empty_like(dst) if verify else dst
                        if mixed:
                            into.copy_(weights)
                            into.mul_(1.0 / WEIGHT_LEVELS)  # a power of two: exact
                            torch.lerp(a, b, into, out=into)
                        else:
                            torch.where(weights < WEIGHT_LEVELS // 2, a, b, out=into)
                        if verify:
                            size = into.element_size()
                            if into.is_floating_point() and size in _SAME_SIZE_INTEGER:
                                as_int = getattr(torch, _SAME_SIZE_INTEGER[size])
                                into, dst = into.view(as_int), dst.view(as_int)
                            if not torch.equal(into, dst):  # `expected_on`: a copy apart
                                result = None
                                self._apart = True
                                return self.reference(*self.content(offset))
                if new:
                    return offset, self._draw
                if not expected:
                    return None
                # A reference returning (a view of) its input: copied, the kernel holds it too.
                if type(result) is torch.Tensor:  # `_shares`, inline (every checked call)
                    shared = int(result.untyped_storage().data_ptr()) in self._storages
                else:
                    shared = _shares(torch, result, self._targets)
                return clone_inputs(torch, result) if shared else result
        finally:
            if new:
                self.refill_s += bound.perf_counter() - started
                self.refills += 1

    def resume(self) -> None:
        """Before a later timing of the same tensors (the re-check wrote into them): a new
        current content, as the timer's first call has no refill."""
        self.before()

    def _new_offset(self) -> int:
        """An unused offset from `os.urandom`; new pools once half are spent (not while checks
        rebuilt from them are queued, short of the limit)."""
        used = self._used
        if len(used) >= WINDOW // 2 and not self._pending or len(used) >= WINDOW - 1:
            for pool in self.weights:  # in place: the timer's seal holds these tensors
                seed = _urandom_seed()
                pool.random_(
                    0, WEIGHT_LEVELS, generator=self.torch.Generator(pool.device).manual_seed(seed)
                )
            used.clear()
        while True:
            offset = int.from_bytes(bound.os_urandom(8), "little") % WINDOW
            if offset not in used:
                used.add(offset)
                return offset

    def content(self, offset: int | None = None, draw: Any = None) -> Any:
        """The current (or `offset`'s or `draw`'s) call's inputs as new tensors."""
        torch = self.torch
        plan = self._plan if self._plan is not None else self.prepare()
        draw = self._draw if draw is None else draw
        with torch.no_grad():
            if plan:
                leaves, steps = [], []
                ends = self.ends if self.ends is not None else ((), ())
                for a, b, pool in zip(*ends, self.weights, strict=True):
                    leaves.append(torch.empty_like(a))
                    steps.extend(_steps(torch, leaves[-1], a, b, pool))
                FreshInputs.before(self, self._offset if offset is None else offset, steps=steps)
            elif self.mode == "maker" and draw is not None:
                leaves = [t.detach().clone() for t in tensor_leaves(torch, draw)]
            else:
                leaves = [t.detach().clone() for t in self._targets]
        return leaves if self._flat else _with_leaves(torch, list(self.storage), leaves)

    def expected_on(self, offset: int) -> Any:
        """The reference's output on the mix's content at `offset`, rebuilt into the timed
        tensors (the call's output copied first) so a check holds no copy of the inputs; where
        they no longer hold it after the reference ran, a copy apart (`_apart`), never a
        verdict by itself. Made in the class's `before` (kept by `bound`), as `drain` does."""
        return FreshInputs.before(self, offset, expected=True)

    def call(self) -> Any:
        return self.kernel(*self.storage)

    def _arguments(self) -> Sequence[Any]:
        """The timed inputs as a check's reference reads them where tensors sit in lists or
        dicts (which a kernel can edit in place): the structure with its tensors taken from
        the sealed `_targets`. Flat inputs need none of this: `storage` is a sealed tuple."""
        return _with_leaves(self.torch, list(self.storage), list(self._targets))

    def after(
        self,
        out: Any,
        *,
        force: bool = False,
        content: tuple[int, Any] | None = None,
        compare: bool = True,
    ) -> CheckKey | None:
        """One timed call returned `out`: plain, and checked if `os.urandom` read now says so
        (always with `force`). `content`: what `before` returned. With `defer`, or without
        `compare` (the CPU timer: it drops `out` first, so a check holds the copy and the
        reference's output, not the call's output too), returns the queued check's key for the
        timer to hand to `drain` (None: not checked)."""
        self._calls += 1
        if content is not None and (content[0] != self._offset or content[1] is not self._draw):
            raise DishonestTiming(
                "the timer's own state (which content the call was given) was changed while "
                f"the kernel was timed: {REWRITES_TIMER}"
            )
        targets = self._targets  # `_layout(targets)`, inline: this runs after every call
        layout = map(_DATA_PTR, targets), map(_STRIDE, targets), map(_SHAPE, targets)
        if tuple(zip(*layout, map(_DTYPE, targets), strict=True)) != self._layout:
            raise DishonestTiming(REPOINTED)
        plain = type(out) is self.torch.Tensor and not out.is_meta
        if plain:
            try:
                out.untyped_storage()
            except (RuntimeError, NotImplementedError):
                plain = False
        if not plain:  # the full rule names what is wrong (or passes a plain structure)
            problem = plain_output_problem(self.torch, out)
            if problem is not None:
                raise DishonestTiming(problem)
        # A kept constant and 32 bits of `os.urandom` now: nothing drawn ahead.
        rate = FIXED_CHECK_RATE if self.mode == "fixed" else CHECK_RATE
        if not (force or int.from_bytes(bound.os_urandom(4), "little") < rate * 2**32) or (
            self.reference is None or self.check is None
        ):
            return None
        # Copied now: work finishing later is not in it.
        offset, draw = content if content is not None else (self._offset, self._draw)
        self.checked += 1
        started = bound.perf_counter()
        snapshot = (
            out.detach().clone()
            if type(out) is self.torch.Tensor
            else clone_inputs(self.torch, out)
        )
        # The mix's content is rebuilt from the offset (no queued tensor to rewrite).
        plan = self._plan if self._plan is not None else self.prepare()
        held = None if plan else draw if self.mode == "maker" else self.content()
        key = (self._calls, offset, held)
        self.check_s += bound.perf_counter() - started
        self._pending.append((key, snapshot))
        if not self.defer and compare:
            self.drain()
            return None
        return key

    def queued_bytes(self) -> int:
        """Bytes the queued checks (`defer`) hold: the outputs' copies, and the content kept to
        rebuild a check's inputs (a maker's draw, the fixed content's copy)."""
        total = 0
        for entry in self._pending:  # an entry that is not (key, copy) is `drain`'s to name
            if type(entry) is tuple and len(entry) == 2:
                key, copy = entry
                held = key[2] if type(key) is tuple and len(key) == 3 else None
                total += _nbytes(self.torch, copy) + _nbytes(self.torch, held)
        return total

    def drain(self, queued: tuple[CheckKey, ...] | None = None) -> None:
        """Compare the queued copies with the reference on their calls' content; raises
        `DishonestTiming` naming the first wrong one, or a queue that is not `queued`."""
        pending = list(self._pending)  # the list itself is sealed: emptied in place
        self._pending.clear()
        keys_found = []  # a loop, not a generator: this runs after every checked call
        for entry in pending:
            keys_found.append(entry[0] if type(entry) is tuple and len(entry) == 2 else entry)
        keys = tuple(keys_found)
        # `queue_tampering`'s test, inline (compared in C): this runs after every checked call.
        if queued is not None and not (
            len(keys) == len(queued) and not any(map(is_not, keys, queued))
        ):
            raise DishonestTiming(queue_tampering(queued, keys) or "")
        if self.reference is None or self.check is None:
            return
        torch = self.torch
        for (number, offset, held), snapshot in pending:
            started = bound.perf_counter()
            with torch.no_grad():
                if held is None:  # the mix: rebuilt from the kept ends and pools
                    expected = FreshInputs.before(self, offset, expected=True)  # `expected_on`
                else:  # a repeating maker's draw made again is used as drawn (no copy)
                    content = held
                    if held is REDRAW and self.make_draw is not None:
                        content = self.make_draw(offset)
                    elif self.mode == "maker":
                        content = self.content(draw=held)
                    expected = self.reference(*content)
                    del content
            # Bit-identical outputs pass without the full rule.
            if type(snapshot) is torch.Tensor and type(expected) is torch.Tensor:
                identical = (
                    snapshot.shape == expected.shape
                    and snapshot.dtype == expected.dtype
                    and bool(torch.equal(snapshot, expected))
                )
            else:
                identical = _identical(torch, snapshot, expected)
            failure = None if identical else self.check(snapshot, expected)
            self.check_s += bound.perf_counter() - started
            if failure is not None:
                raise DishonestTiming(
                    f"timed call {number} returned a wrong output ({failure}), copied right "
                    "after the call and compared with the reference on that call's own inputs: "
                    "its result was cached, left uncomputed, or computed after the call "
                    "returned (on another stream or thread). Every timed call must do the "
                    "whole work (which calls are checked is decided after each returns)"
                )

    def finish(self) -> None:
        """Check what is still queued (the end of a timing)."""
        self.drain()

    def abandon(self) -> None:
        """A timing that failed: its queued copies are dropped, not compared (the item has
        failed already; on a GPU they can hold most of its memory)."""
        self._pending.clear()

    def to_dict(self) -> dict[str, Any]:
        per_call = self.refill_s / self.refills if self.refills else 0.0
        checked, rate = self.outputs_checked, self.rate  # each property read once
        return {
            "mode": self.mode,
            "outputs_checked": self.outputs_checked,
            "note": self.note,
            "inputs_fixed": self.inputs_fixed,
            "calls": self._calls,
            "checked_calls": self.checked,
            "check_rate": rate if checked else 0.0,
            # How likely a kernel skipping half of its calls got through this timing.
            "survival_half_skipped": survival(rate, 0.5, self._calls) if checked else 1.0,
            "refill_s": round(self.refill_s, 6),
            "refill_per_call_s": per_call,
            "check_s": round(self.check_s, 6),
        }


# Names that, set on a `FreshInputs`, would shadow one of its methods or the rate's property.
SHADOWING = frozenset(
    {
        name
        for name, value in vars(FreshInputs).items()
        if not name.startswith("__") and (callable(value) or isinstance(value, property))
    }
)


def _weight_pool(torch: Any, leaf: Any) -> Any:
    """Bytes uniform in [0, `WEIGHT_LEVELS`), `WINDOW` more than `leaf`'s size, seeded by
    `os.urandom`: element i of a call's content takes the weight k / `WEIGHT_LEVELS`, k the
    pool's value at the call's offset plus i."""
    gen = torch.Generator(device=leaf.device).manual_seed(_urandom_seed())
    size = (int(leaf.numel()) + WINDOW,)
    return torch.randint(
        0, WEIGHT_LEVELS, size, generator=gen, dtype=torch.uint8, device=leaf.device
    )


# One chunk of a leaf's mix, views made once (`_steps`): the timed tensor's chunk `dst`, the
# ends' chunks `a` and `b`, the leaf's pool, the chunk's first and end element, the shape its
# window of weights takes (None: `dst` is flat), and whether it is mixed by `lerp` (else a or
# b per element).
Step = tuple[Any, Any, Any, Any, int, int, Any, bool]


def _steps(torch: Any, dst: Any, a: Any, b: Any, pool: Any) -> list[Step]:
    """`dst`'s mix of `a` and `b` by `pool` as consecutive chunks of at most about `CHUNK`
    elements (by the first dimension where a tensor is not contiguous); element i of `dst`
    takes the weight at the offset plus i, in row-major order whatever the strides. `b is a`:
    the second end is `a` rolled by half its first dimension (`_second_ends`), row i taking
    row i + half, modulo the rows: views of `a`, a chunk split in two where they wrap."""
    total = int(a.numel())
    if total == 0:
        return []
    half = int(a.shape[0]) // 2 * (total // int(a.shape[0])) if b is a else 0  # elements
    if dst.is_contiguous() and a.is_contiguous() and b.is_contiguous():
        dst, a, b = dst.view(-1), a.view(-1), b.view(-1)
    mixed = _mixable(torch, a)
    rows = int(dst.shape[0])
    per_row = total // rows
    shift = half // per_row
    step = max(1, (CHUNK if dst.device.type == "cpu" else DEVICE_CHUNK) // per_row)
    steps = []
    for first in range(0, rows, step):
        i, end = first, min(rows, first + step)
        while i < end:
            src = (i + shift) % rows
            stop = min(end, i + rows - src)
            part = dst[i:stop]
            shape = None if part.dim() == 1 else part.shape
            ends = a[i:stop], b[src : src + stop - i]
            steps.append((part, *ends, pool, i * per_row, stop * per_row, shape, mixed))
            i = stop
    return steps


_SAME_SIZE_INTEGER = {8: "int64", 4: "int32", 2: "int16", 1: "int8"}


def _shares(torch: Any, obj: Any, targets: Sequence[Any]) -> bool:
    """Whether a tensor of `obj` shares storage with one of `targets` (loops, not
    comprehensions: a checked call of a structured output runs this)."""
    ours = set()
    for target in targets:
        ours.add(int(target.untyped_storage().data_ptr()))
    for tensor in [obj] if type(obj) is torch.Tensor else tensor_leaves(torch, obj):
        if int(tensor.untyped_storage().data_ptr()) in ours:
            return True
    return False


def _same_leaves(torch: Any, a: Any, b: Any, *, values: bool) -> bool:
    """The same tensor leaves in shape and dtype, and in `values` (else in device)."""
    left, right = tensor_leaves(torch, a), tensor_leaves(torch, b)
    if len(left) != len(right):
        return False
    for x, y in zip(left, right, strict=True):  # a loop: a generator's every step is a call
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not (bool(torch.equal(x, y)) if values else x.device == y.device):
            return False
    return True


def _identical(torch: Any, got: Any, expected: Any) -> bool:
    """Same structure, and every tensor leaf equal in shape, dtype and every bit of value."""
    left, right = leaves_of(torch, got), leaves_of(torch, expected)
    if len(left) != len(right):
        return False
    for (path_a, a), (path_b, b) in zip(left, right, strict=True):
        tensor = isinstance(a, torch.Tensor)
        if path_a != path_b or tensor != isinstance(b, torch.Tensor) or not tensor and a != b:
            return False
        if tensor and (a.shape != b.shape or a.dtype != b.dtype or not bool(torch.equal(a, b))):
            return False
    return True


def _jittered(torch: Any, leaves: list[Any]) -> list[Any]:
    """The second end of a one-draw mix: A * (1 + JITTER * V), V uniform in [0, 1) (signs,
    zeros and integer tensors kept)."""
    gen_seed = _urandom_seed()
    out = []
    for a in leaves:
        if not _mixable(torch, a):
            out.append(a.detach())  # the same content; not `a` itself (`b is a`: rolled)
            continue
        gen = torch.Generator(device=a.device).manual_seed(gen_seed)
        v = torch.rand(a.shape, generator=gen, dtype=a.dtype, device=a.device)
        out.append(v.mul_(JITTER).add_(1).mul_(a))  # in place: one input's size at a time
    return out


def _second_ends(torch: Any, a_leaves: list[Any], draw: Any, others: Sequence[Any]) -> list[Any]:
    """The mix's second end per leaf: the first end itself (`b is a`: rolled by half its first
    dimension in `_steps`, no memory) where the roll differs from it, else the draw's tensor (a
    copy where it shares storage with the timed inputs or the first end)."""
    ends = []
    for a, t in zip(a_leaves, tensor_leaves(torch, draw), strict=True):
        n = int(a.shape[0]) if a.dim() else 0
        h = n // 2  # row i rolled is row i + h: the same tensor where those rows are all equal
        if h and not (torch.equal(a[: n - h], a[h:]) and torch.equal(a[n - h :], a[:h])):
            ends.append(a)
        else:
            ends.append(t.detach().clone() if _shares(torch, t, others) else t.detach())
    return ends


def overlaps_itself(tensor: Any) -> bool:
    """Whether elements of `tensor` share memory: a stride 0 on a dimension of size > 1
    (a loop: a generator's every step is a call)."""
    for size, stride in zip(tensor.shape, tensor.stride(), strict=True):
        if size > 1 and stride == 0:
            return True
    return False


def _finite(torch: Any, out: Any) -> list[bool]:
    """Per tensor of `out`, whether every element is finite, read in chunks of `CHUNK`
    elements (`torch.isfinite` of a whole float tensor holds temporaries of 1.75 times it)."""
    found = []
    for tensor in tensor_leaves(torch, out):
        flat = tensor.reshape(-1)  # a view where the tensor is contiguous
        chunks = range(0, int(flat.numel()), CHUNK)
        found.append(all([bool(torch.isfinite(flat[i : i + CHUNK]).all()) for i in chunks]))
    return found


def _mix_valid(fresh: FreshInputs, finite_before: list[bool]) -> str | None:
    """Why a mixed input is not valid, or None: on one untimed call the kernel must not raise
    and must agree with the reference, whose output stays finite where it was on the first
    inputs (`finite_before`). The reference reads the content rebuilt into the timed tensors
    (`FreshInputs.expected_on`), the kernel's output copied first where it is one of them."""
    torch = fresh.torch
    try:
        fresh.before()
        with torch.no_grad():
            got = fresh.kernel(*fresh.storage)
            if fresh.reference is None or fresh.check is None:
                return None
            if _shares(torch, got, fresh._targets):
                got = clone_inputs(torch, got)
            expected = fresh.expected_on(fresh._offset)
    except Exception as exc:
        return f"{type(exc).__name__} on a mixed input: {str(exc)[:160]}"
    finite_after = _finite(torch, expected)
    for was_finite, is_finite in zip(finite_before, finite_after, strict=False):
        if was_finite and not is_finite:
            return "the reference's output is not finite on a mixed input"
    failure = fresh.check(got, expected)
    if failure is not None:
        return f"the kernel and the reference disagree on a mixed input ({failure[:160]})"
    return None


def _second_draw(
    torch: Any,
    inputs: Sequence[Any],
    first_leaves: list[Any],
    make_draw: Callable[[int], Sequence[Any]] | None,
) -> tuple[Any, str, bool]:
    """Whether the inputs regenerate: a second draw of the input maker, else None and why the
    inputs are fixed; and whether an input is broadcast (a stride 0 on a dimension of size
    > 1 shares memory between elements: no in-place refill, mix or maker, can write it, so
    it is timed on fixed content)."""
    shared = [i for i, t in enumerate(first_leaves) if overlaps_itself(t)]
    if shared:
        why = f"input {shared[0]} is broadcast (an `expand`: its elements share memory) and "
        return None, why + "cannot be refilled in place", True
    if make_draw is None:
        return None, "no input maker (fixed input tensors)", False
    second = make_draw(_urandom_seed())
    if not _same_leaves(torch, inputs, second, values=False):
        return None, "the input maker's draws differ in shape, dtype or device", False
    if _same_leaves(torch, inputs, second, values=True):
        return None, "the input maker returned the same contents for another seed", False
    return second, "", False


def fresh_inputs(
    torch: Any,
    kernel: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    device: str,
    make_draw: Callable[[int], Sequence[Any]] | None,
    reference: Callable[..., Any] | None,
    check: Callable[[Any, Any], str | None] | None,
    free_bytes: int | None = None,
    name: str | None = None,
) -> FreshInputs:
    """The `FreshInputs` of `kernel` on the timed `inputs`: `make_draw(seed)` the input maker
    (None: none), `reference` and `check` enable the checks, `name` names the kernel."""
    label = name or getattr(kernel, "__qualname__", None) or type(kernel).__name__
    fresh = FreshInputs(torch, kernel, inputs, name=label, reference=reference, check=check)
    fresh.defer = device.startswith("cuda")
    first_leaves = tensor_leaves(torch, inputs)
    if not first_leaves:
        fresh.mode = "none"
        fresh.note = "fresh inputs: none to refresh (no tensor inputs)"
        return fresh
    free = free_memory_bytes(torch, device) if free_bytes is None else free_bytes
    room = math.inf if free is None else MEMORY_SHARE * free
    in_bytes = _nbytes(torch, inputs)
    with torch.no_grad():
        a_leaves = [t.detach().clone() for t in first_leaves]
        out_bytes, finite_first = 0, []
        if fresh.outputs_checked and reference is not None:
            # Its size and where it is finite, dropped before the second draw is made.
            expected_first = reference(*_with_leaves(torch, list(inputs), list(a_leaves)))
            out_bytes, finite_first = _nbytes(torch, expected_first), _finite(torch, expected_first)
            del expected_first
    second, why_fixed, shared = _second_draw(torch, inputs, first_leaves, make_draw)
    regenerates = second is not None
    pools_bytes = sum([int(t.numel()) + WINDOW for t in first_leaves])
    mix_bytes = 2 * in_bytes + pools_bytes + 2 * out_bytes
    if mix_bytes <= room and not shared:
        with torch.no_grad():
            b_leaves = (
                _second_ends(torch, a_leaves, second, (*first_leaves, *a_leaves))
                if second is not None
                else _jittered(torch, a_leaves)
            )
            second = None  # the rolled leaves' draws go (`regenerates` says one was made)
            fresh.weights = [_weight_pool(torch, t) for t in a_leaves]
        fresh.ends = (a_leaves, b_leaves)
        fresh.mode = "mix"
        kept_seed = _urandom_seed()
        kept = kept_content(fresh, kept_seed)  # before the kernel's first call on the mix
        invalid = _mix_valid(fresh, finite_first)
        if kept_content_changed(fresh, kept_seed, kept):
            raise DishonestTiming(KEPT_CHANGED + " (in the mix's validity trial)")
        if invalid is None:
            ends = "themselves rolled by half their rows" if regenerates else "a jitter of them"
            kept_b = _nbytes(
                torch, [b for a, b in zip(a_leaves, b_leaves, strict=True) if b is not a]
            )
            fresh.note = (
                f"fresh inputs: new content every call, mixed per element between the inputs "
                f"and {ends} ({_mib(in_bytes + kept_b + pools_bytes)} kept)"
            )
            if not regenerates:
                _warn_fixed(fresh, why_fixed, "mixed with a jitter of themselves")
            return fresh
        why_not_mix = f"a mixed input is not valid ({invalid})"
    else:
        why_not_mix = (
            "no mix"
            if shared
            else f"the mix needs {_mib(mix_bytes)}, more than {MEMORY_SHARE:.0%} of the free memory"
        )
    fresh.ends, fresh.weights, fresh._plan = None, [], None  # the plan of the mix no more
    with torch.no_grad():
        for dst, src in zip(tensor_leaves(torch, inputs), a_leaves, strict=True):
            if not shared:  # a tried mix wrote them (a broadcast input was never written)
                dst.copy_(src)
    # The second draw and the kept copy (the loop's `src` holds its last leaf) go before the
    # maker is asked twice more: held beside those two draws they made the setup 5 copies of
    # the inputs where 3 are needed.
    del second, a_leaves, src
    if regenerates and make_draw is not None:
        fresh.mode = "maker"
        fresh.make_draw = make_draw
        seed = _urandom_seed()
        fresh.maker_repeats = _same_leaves(torch, make_draw(seed), make_draw(seed), values=True)
        fresh.note = f"fresh inputs: a new draw of the input maker every call ({why_not_mix})"
        return fresh
    fresh.mode = "fixed"
    fresh.note = (
        f"fresh inputs: off ({why_fixed}; {why_not_mix}): every call sees the same "
        "contents with a new _version"
        + (
            ", every call's output is checked; a memo keyed by the contents cannot be excluded"
            if fresh.outputs_checked
            else "; timed outputs are not checked"
        )
    )
    _warn_fixed(fresh, why_fixed, "the same contents on every call, every output checked")
    return fresh


def _warn_fixed(fresh: FreshInputs, why: str, timed_how: str) -> None:
    """The record's `inputs_fixed`: the kernel and what to change (a note, not a warning:
    warnings as errors would fail the kernel)."""
    fresh.inputs_fixed = (
        f"{fresh.name}: its inputs cannot be regenerated per timed call ({why}). Make its "
        "`inputs=` a factory that makes new tensors from torch's RNG on every call (the plugin "
        "seeds it; for a KernelBench file: get_inputs() with torch.rand/randn), not one that "
        f"returns the same tensors or buffers; timed with {timed_how}"
    )


bound.keep_module(sys.modules[__name__])
