"""Extension points of pytest-kernelpro, registered through `pytest_addhooks`.

Implement them in a `conftest.py` or a plugin package; no fork needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from pytest_kernelpro.measure.devices import DeviceSpec
    from pytest_kernelpro.measure.roofline import OpCost
    from pytest_kernelpro.record import KernelRecord

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_kernelpro_defaults(config: Any) -> dict[str, Any] | None:
    """Return default settings for this project (ini key names without the `kernelpro_`
    prefix). They rank below the ini file: marker > command line > KERNELPRO_* > ini >
    these defaults > built-in defaults. Values may be parsed values or strings.

    Example (conftest.py)::

        def pytest_kernelpro_defaults(config):
            return {"device": "cuda", "time_budget": 3.0, "threshold": 0.05}
    """


@hookspec
def pytest_kernelpro_device_specs() -> list[DeviceSpec]:
    """Return extra GPU specs; they win over the built-in table for matching names. An
    optimizer prompt adds the per-SM limits and tensor-core shapes of the architectures it
    knows (by the spec's `arch`) and the L2 of the built-in GPUs, never a guessed one.

    Example (conftest.py)::

        from pytest_kernelpro.measure.devices import DeviceSpec

        def pytest_kernelpro_device_specs():
            return [DeviceSpec(name="NVIDIA RTX 6000 Ada", aliases=("RTX 6000 Ada",), arch="sm_89",
                               sms=142, dram_bandwidth_Bps=960e9,
                               peak_flops={"fp32": 91.1e12, "bf16_tensor": 364e12},
                               source="datasheet")]
    """


@hookspec(firstresult=True)
def pytest_kernelpro_op_cost(
    op: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> OpCost | None:
    """Return the FLOPs and bytes of one aten op (e.g. your custom op), or None to let the
    built-in formulas count it.

    Example (conftest.py)::

        from pytest_kernelpro.measure.roofline import OpCost

        def pytest_kernelpro_op_cost(op, args, kwargs, out):
            if op.startswith("mylib.fused_rope"):
                n = out.numel()
                return OpCost(op=op, category="elementwise", flops=6 * n,
                              bytes_unfused=3 * n * out.element_size(), dtype=str(out.dtype),
                              peak_key="fp32")
            return None
    """


@hookspec
def pytest_kernelpro_record(record: KernelRecord) -> None:
    """Called on the controller with every finished kernel record (e.g. to upload it).

    Example (conftest.py)::

        def pytest_kernelpro_record(record):
            if record.outcome == "failed":
                notify_team(record.name, record.message)
    """


@hookspec
def pytest_kernelpro_autotuners() -> list[type] | None:
    """Return autotuner classes that behave like Triton's `Autotuner` (`configs`, `keys`,
    `cache` of key -> chosen config, `best_config`, `run`), e.g. a library's own copy of it:
    their choices are recorded and compared with the baseline's like Triton's
    (`measure/environment.py`). Triton's own class needs no hook.

    Example (conftest.py)::

        def pytest_kernelpro_autotuners():
            from mylib.tuning import Autotuner
            return [Autotuner]
    """


@hookspec
def pytest_kernelpro_setting_names() -> list[str] | None:
    """Return the names of settings a plugin resolves itself (its `--kernelpro-*` flags, ini
    keys and `KERNELPRO_*` variables), so `pytest_kernelpro_defaults` may name them too."""


@hookspec
def pytest_kernelpro_item_measured(run: Any, session: Any, set_phase: Any) -> None:
    """Called in the item's process once a kernel item was checked, timed and placed on its
    roofline, before the gate's verdict (the optimizer runs its search here). `run` is the
    item's `run.context.ItemRun`, `session` the `run.session.KernelproSession` (`add_record`,
    `settings`), `set_phase(text)` names the work for the item's time-limit message.
    `run.record.wall_s` holds the item's time so far (what checking and timing it took).
    """


@hookspec
def pytest_kernelpro_isolated_child_args(config: Any) -> list[str] | None:
    """Return the command-line arguments a plugin needs passed on to the process that runs
    one item under `--kernelpro-isolate` (its own flags as this session resolved them)."""
