"""The problem a search is given, from the live kernel item: the prompt's `ProblemContext`
(the reference and the current kernel as the user wrote them, the inputs actually used) and
the import path the sandbox's processes load the user's modules with."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_kernelpro.errors import KernelproError

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.agents.problem_context import ProblemContext
    from pytest_kernelpro.run.context import ItemRun


def problem_context(
    run: ItemRun, device: str, sandbox_source: str, rootpath: Path
) -> ProblemContext:
    """The ProblemContext of a kernel item, from its live objects in this process (the marked
    kernel found in `run.module`, the test module pytest imported)."""
    import inspect

    from pytest_kernelpro.optimize.agents.problem_context import build_context
    from pytest_kernelpro.problem import MarkerOptions, marker_of
    from pytest_kernelpro.profile.problem_loader import lookup_qualname

    problem = run.problem
    if problem.kind == "kernelbench":
        from pytest_kernelpro.optimize.agents.problem_context import ProblemContext, SourcePart

        return ProblemContext(
            name=problem.display_name,
            reference=SourcePart("The KernelBench problem", problem.source_file, sandbox_source),
        )
    kernel = lookup_qualname(run.module, run.locator.qualname)
    mark = marker_of(kernel) if kernel is not None else None
    if mark is None:
        raise KernelproError(
            f"cannot find the marked kernel {run.locator.qualname} in {run.locator.path}"
        )
    options = MarkerOptions.from_marker(mark.args, dict(mark.kwargs), kernel_name=run.name)
    inputs = problem.make_inputs(device, 0)
    reference_module = None
    if inspect.isclass(options.reference):
        reference_module = problem.reference_factory("cpu")
    init = options.init_inputs() if callable(options.init_inputs) else options.init_inputs
    context = build_context(
        problem.display_name,
        options.reference,
        kernel=kernel,
        inputs=inputs,
        init_args=tuple(init or ()),
        reference_module=reference_module,
        device=device,
        sandbox_source=sandbox_source,
        root=str(rootpath),
    )
    del inputs
    return context


def session_path() -> tuple[str, ...]:
    """The sys.path pytest built for this session (rootdir and conftest insertions, the
    `pythonpath` ini, a src/ layout): the sandbox imports the kernel's modules with it."""
    return tuple(p for p in sys.path if p)
