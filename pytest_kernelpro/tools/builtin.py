"""Imports every built-in tool family; their `@ToolRegistry.register` decorators register them."""

from __future__ import annotations

from pytest_kernelpro.tools import (  # noqa: F401
    dram,
    fusion,
    launch,
    memory,
    occupancy,
    pipes,
    shared,
    spills,
    stalls,
    tensorcore,
    timeline,
    work,
)
