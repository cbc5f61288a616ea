"""KernelBench problems shrunk to a CPU size: the module-level integer size constants of a
problem's text scaled down until one call's inputs and output fit a budget.

KernelBench's sizes are GPU sizes (a call's tensors reach GBs); on a small CPU machine a sweep
needs the same problems smaller. The shrink rewrites only module-level assignments whose value
is an integer literal (or integer arithmetic on literals: `N = 2048 * 2`), or a tuple/list of
them (`D, H, W = 24, 32, 32`, `layer_sizes = [16384, 16384]`). Names that set an operator's
geometry rather than a size (kernel, stride, padding, dilation, groups, heads, scale factors,
ratios, layer counts, reduction axes) are never changed; expressions that use other names
(`groups = in_channels`, `bias_shape = (out_channels, 1, 1)`) follow the changed names.

The search: the largest changeable value is halved (floor, at least 1), one at a time; every
step builds the model and runs one forward on PyTorch's `meta` device (shapes only, no
memory, no arithmetic), so a shrunk form that breaks a divisibility the problem needs (channels
by groups, a sequence by its block) is seen at once; that value is then kept at its last
working size and the search goes on with the others. A problem whose own text does not build,
or whose smallest working form is still over the budget, is "not shrinkable" with the reason.
A problem whose build or forward cannot run on `meta` (`.item()`, data-dependent shapes) is
built and run for real on the CPU when its inputs are at most 64 MiB, else measured by its
inputs alone, twice (the output taken as large as the inputs), and says so.
"""

from __future__ import annotations

import ast
import contextlib
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any

# Names that set an operator's geometry or a count of layers, not a tensor's extent: halving
# them changes the operator (or breaks it) without making the call much smaller.
FIXED_NAME_RE = re.compile(
    r"kernel|stride|pad|dilation|group|head|scale|factor|ratio|layers|stages|patch|"
    r"^axis|block_len|clusters|bias|return|dropout|pdrop|eps|momentum",
    re.IGNORECASE,
)
# `dim`, `reduce_dim`: an axis when small (a tensor has at most 6 here), a size when large.
AXIS_NAME_RE = re.compile(r"(^|_)dim$", re.IGNORECASE)
LARGEST_AXIS = 6
MIB = 2**20


class NotShrinkable(Exception):
    """The problem's text does not build, or its smallest working form is over the budget."""


@dataclass
class Slot:
    """One changeable integer: the assignment it sits in and its place in a tuple/list."""

    name: str
    node: ast.Assign
    index: int | None  # None: the whole value; else the element of a tuple/list literal
    value: int


@dataclass
class ShrinkResult:
    text: str
    original_bytes: int
    shrunk_bytes: int
    changes: dict[str, tuple[int, int]] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)  # halving broke the problem: left as is
    # "meta": built and run on the meta device; "cpu": for real (the meta device cannot run
    # it); "inputs x2": too large to run for real, the output taken as large as the inputs.
    how: str = "meta"


def _int_value(node: ast.expr) -> int | None:
    """An integer literal or integer arithmetic on literals; None for anything else."""
    if isinstance(node, ast.Constant):
        value = node.value
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(node, ast.BinOp):
        left, right = _int_value(node.left), _int_value(node.right)
        if left is None or right is None:
            return None
        ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__}
        ops.update({ast.FloorDiv: int.__floordiv__, ast.Pow: int.__pow__})
        op = ops.get(type(node.op))
        return None if op is None else op(left, right)
    return None


def _changeable(name: str, value: int | None) -> bool:
    if value is None or value <= 1 or FIXED_NAME_RE.search(name):
        return False
    return not (AXIS_NAME_RE.search(name) and value <= LARGEST_AXIS)


def find_slots(tree: ast.Module) -> list[Slot]:
    """Every changeable integer size constant at module level."""
    slots: list[Slot] = []
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                value = _int_value(node.value)
                if _changeable(target.id, value):
                    slots.append(Slot(target.id, node, None, value))  # type: ignore[arg-type]
                elif isinstance(node.value, (ast.Tuple, ast.List)):
                    for i, element in enumerate(node.value.elts):
                        v = _int_value(element)
                        if _changeable(target.id, v):
                            slots.append(Slot(f"{target.id}[{i}]", node, i, v))  # type: ignore[arg-type]
            elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                for i, (name, element) in enumerate(zip(target.elts, node.value.elts, strict=True)):
                    v = _int_value(element)
                    if isinstance(name, ast.Name) and _changeable(name.id, v):
                        slots.append(Slot(name.id, node, i, v))  # type: ignore[arg-type]
            break  # chained `a = b = 64`: one slot for the shared value (the first name)
    return slots


def render(text: str, slots: list[Slot]) -> str:
    """The problem's text with every slot's value written in place of its expression."""
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, int, int, str]] = []
    for slot in slots:
        target = slot.node.value if slot.index is None else slot.node.value.elts[slot.index]  # type: ignore[attr-defined]
        edits.append(
            (
                target.lineno,
                target.col_offset,
                target.end_lineno or target.lineno,
                target.end_col_offset or 0,
                str(slot.value),
            )
        )
    # Later edits first, so the earlier ones' offsets stay right.
    for line, col, end_line, end_col, new in sorted(edits, reverse=True):
        head = lines[line - 1][:col]
        tail = lines[end_line - 1][end_col:]
        lines[line - 1 : end_line] = [head + new + tail]
    return "".join(lines)


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _meta_only(error: Exception) -> bool:
    """An error of the meta device itself (data-dependent: `.item()`, a nonzero), not of the
    problem."""
    text = str(error).lower()
    return isinstance(error, (NotImplementedError, RuntimeError)) and (
        "meta" in text or "data-dependent" in text
    )


def _run(text: str, device: str) -> tuple[int, int | None]:
    """(inputs bytes, output bytes) of one call built on `device`; output None when the
    model's build or forward is not possible on the meta device."""
    import torch

    module = types.ModuleType("kp_shrunk_problem")
    with torch.device(device), contextlib.redirect_stdout(sys.stderr):
        exec(compile(text, "<problem>", "exec"), module.__dict__)  # noqa: S102 - a copy of a KernelBench problem
        inputs = module.get_inputs()
        in_bytes = sum(t.numel() * t.element_size() for t in _tensors(inputs))
        try:
            model = module.Model(*module.get_init_inputs())
            with torch.no_grad():
                output = model(*inputs)
        except Exception as error:
            if device == "meta" and _meta_only(error):
                return in_bytes, None
            raise
    return in_bytes, sum(t.numel() * t.element_size() for t in _tensors(output))


def call_bytes(text: str, real_limit: int = 64 * MIB) -> tuple[int, str]:
    """One call's inputs + output bytes and how they were found: built and run on the meta
    device (shapes only); where the meta device cannot run the model, for real on the CPU if
    the inputs are at most `real_limit`, else the inputs taken twice. Raises what building the
    problem raises."""
    in_bytes, out_bytes = _run(text, "meta")
    if out_bytes is not None:
        return in_bytes + out_bytes, "meta"
    if in_bytes <= real_limit:
        in_bytes, out_bytes = _run(text, "cpu")
        return in_bytes + (out_bytes or 0), "cpu"
    return 2 * in_bytes, "inputs x2"


def shrink(text: str, budget_mib: float, max_steps: int = 400) -> ShrinkResult:
    """The problem's text with its size constants halved, largest first, until one call's
    inputs + output are at most `budget_mib` MiB. Raises NotShrinkable with the reason."""
    budget = budget_mib * MIB
    try:
        original, how = call_bytes(text)
    except Exception as error:  # noqa: BLE001 - any failure of the problem's own text
        raise NotShrinkable(
            f"the problem does not build: {type(error).__name__}: {error}"
        ) from error
    tree = ast.parse(text)
    slots = find_slots(tree)
    start = {s.name: s.value for s in slots}
    kept: set[str] = set()
    current = original
    for _ in range(max_steps):
        if current <= budget:
            break
        movable = [s for s in slots if s.value > 1 and s.name not in kept]
        if not movable:
            break
        largest = max(s.value for s in movable)
        # Equal sizes are often equal on purpose (a square matrix, a residual add, a loss's
        # target matching its prediction): halve them together first, then the one alone.
        together = [s for s in movable if s.value == largest]
        for group in [together, together[:1]] if len(together) > 1 else [together]:
            before = [slot.value for slot in group]
            for slot in group:
                slot.value //= 2
            try:
                current, how = call_bytes(render(text, slots))
                break
            except Exception:  # noqa: BLE001 - this halving broke the problem: undo it
                for slot, value in zip(group, before, strict=True):
                    slot.value = value
        else:
            kept.add(together[0].name)  # no halving of it works: keep its last working size
    if current > budget:
        reason = (
            f"the smallest working form is {current / MIB:.1f} MiB per call "
            f"(budget {budget_mib:g} MiB; original {original / MIB:.1f} MiB)"
        )
        if kept:
            reason += f"; halving broke it at {', '.join(sorted(kept))}"
        raise NotShrinkable(reason)
    return ShrinkResult(
        text=render(text, slots),
        original_bytes=original,
        shrunk_bytes=current,
        changes={s.name: (start[s.name], s.value) for s in slots if s.value != start[s.name]},
        kept=sorted(kept),
        how=how,
    )
