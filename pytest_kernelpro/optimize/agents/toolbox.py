"""Tools the Programmer may call while it writes a candidate (the Messages API's tool use).

- `ProfilingToolbox`: the reactive orchestration of the ablation. Instead of every relevant
  tool's guidance in the prompt (proactive), the model is told which micro-profiling tools
  ran on the parent and asks for the ones it wants (`run_profiling_tool`), or for a section of
  the profile (`get_profile_section`: SASS, timeline, ncu metrics). Answers come from the
  parent's real profile (the guidance the profiling evaluator made), so the two modes see the
  same facts and differ only in who picks them.
- `CutlassToolbox`: `search_cutlass` (budgeted per Programmer call), `read_cutlass_file`,
  `list_cutlass_directory` over the CUTLASS headers found (`cutlass.locate`, the
  nvidia-cutlass wheel), and `check_smem_layout` (a CuTe `tile_to_shape` probe compiled with
  nvcc), unbudgeted.
- `Toolboxes`: several boxes offered together.

Every result is text; a refused or failed call is text starting with "error:", which the
model reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

SECTIONS = {
    "sass": "SASS summary",
    "timeline": "Timeline summary",
    "findings": "Findings (by severity)",
    "metrics": "ncu metrics by category",
}
_FINDING = re.compile(r"^#### \d+\. \[(?P<sev>[A-Z]+)\] (?P<title>.*)$", re.MULTILINE)
_TOOL = re.compile(r"tool `(?P<tool>[^`]+)`")


def split_sections(guidance_md: str) -> dict[str, str]:
    """The "### ..." sections of a tools guidance Markdown, by their SECTIONS key."""
    out: dict[str, str] = {}
    parts = re.split(r"^### ", guidance_md, flags=re.MULTILINE)
    for part in parts[1:]:
        title, _, body = part.partition("\n")
        for key, name in SECTIONS.items():
            if title.strip() == name:
                out[key] = f"### {title.strip()}\n{body.strip()}\n"
    return out


def findings_by_tool(guidance_md: str) -> dict[str, str]:
    """Each tool's finding block (Markdown) in a tools guidance, by tool name."""
    section = split_sections(guidance_md).get("findings", "")
    out: dict[str, str] = {}
    matches = list(_FINDING.finditer(section))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(section)
        block = section[match.start() : end].strip()
        tool = _TOOL.search(block)
        if tool:
            name = tool.group("tool")
            out[name] = (out[name] + "\n\n" + block) if name in out else block
    return out


class ProfilingToolbox:
    """The parent's profile, answered tool by tool (reactive orchestration)."""

    def __init__(self, guidance_md: str, *, tools_ran: tuple[str, ...] = ()) -> None:
        self.guidance_md = guidance_md
        self.sections = split_sections(guidance_md)
        self.findings = findings_by_tool(guidance_md)
        self.tools_ran = tuple(dict.fromkeys((*tools_ran, *self.findings)))

    def specs(self) -> list[dict[str, Any]]:
        names = ", ".join(self.tools_ran) or "(none fired)"
        return [
            {
                "name": "run_profiling_tool",
                "description": "Run one micro-profiling tool on the current solution's "
                f"profile and get its finding. Tools with findings: {names}.",
                "input_schema": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "description": "tool name"}},
                    "required": ["name"],
                },
            },
            {
                "name": "get_profile_section",
                "description": "One section of the current solution's profile: sass (SASS "
                "instruction summary), timeline (launches, gaps, syncs), metrics (ncu metrics "
                "by category).",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "section": {"type": "string", "enum": ["sass", "timeline", "metrics"]}
                    },
                    "required": ["section"],
                },
            },
        ]

    def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        if name == "run_profiling_tool":
            tool = str(arguments.get("name") or "")
            if tool in self.findings:
                return self.findings[tool]
            return (
                f"tool {tool!r} reported no finding for this profile"
                if tool
                else "error: give the tool's name"
            )
        if name == "get_profile_section":
            section = str(arguments.get("section") or "")
            if section in self.sections and section != "findings":
                return self.sections[section]
            return f"error: unknown or missing section {section!r}; use sass, timeline or metrics"
        return f"error: unknown tool {name!r}"

    def prompt_note(self) -> str:
        """What the optimize prompt says instead of the guidance itself."""
        names = ", ".join(f"`{t}`" for t in self.tools_ran) or "none"
        return (
            "## Profiling tools (on request)\n"
            "The current solution was profiled (ncu, SASS, timeline). Call "
            "`run_profiling_tool` to get one micro-profiling tool's finding and "
            "`get_profile_section` for the raw sections; tools with findings: "
            f"{names}.\n"
        )


class CutlassToolbox:
    """The seed's CUTLASS tools over the headers found (module doc)."""

    def __init__(self, search_tools: Any, *, arch: str, smem_check: Any = None) -> None:
        self.search_tools = search_tools
        self.arch = arch
        if smem_check is None:
            from pytest_kernelpro.optimize.cutlass.smem_check import check_smem_layout

            smem_check = check_smem_layout
        self.smem_check = smem_check

    @classmethod
    def find(cls, arch: str, *, search_budget: int = 8) -> CutlassToolbox | None:
        """A toolbox over the CUTLASS install `cutlass.locate` finds, or None."""
        from pytest_kernelpro.optimize.cutlass.locate import locate_cutlass
        from pytest_kernelpro.optimize.cutlass.search_tools import CutlassSearchTools

        lookup = locate_cutlass()
        if lookup.install is None:
            return None
        return cls(CutlassSearchTools(lookup.install.root, search_budget=search_budget), arch=arch)

    def new_iteration(self) -> None:
        """Refill the search budget (once per Programmer call)."""
        self.search_tools.new_iteration()

    def specs(self) -> list[dict[str, Any]]:
        return [
            *self.search_tools.tool_specs(),
            {
                "name": "check_smem_layout",
                "description": "Compile a CuTe tile_to_shape(atom, tile_shape) probe against "
                "the CUTLASS headers with nvcc: catches shape/stride divisibility errors and "
                "over-limit shared memory before a full build.",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "atom": {
                            "type": "string",
                            "description": "e.g. GMMA::Layout_K_SW128_Atom<cute::half_t>",
                        },
                        "tile_shape": {"type": "array", "items": {"type": "integer"}},
                        "element": {"type": "string", "description": "e.g. cute::half_t"},
                    },
                    "required": ["atom", "tile_shape"],
                },
            },
        ]

    def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        if name == "check_smem_layout":
            try:
                result = self.smem_check(
                    str(arguments.get("atom") or ""),
                    [int(n) for n in arguments.get("tile_shape") or ()],
                    element=str(arguments.get("element") or "cute::half_t"),
                    arch=self.arch,
                )
            except (ValueError, TypeError) as exc:
                return f"error: {exc}"
            except Exception as exc:  # KernelproError for a bad expression
                return f"error: {exc}"
            return result.render()
        return self.search_tools.dispatch(name, arguments)


class Toolboxes:
    """Several toolboxes offered together; a call goes to the box that has the tool."""

    def __init__(self, *boxes: Any) -> None:
        self.boxes = [b for b in boxes if b is not None]

    def __bool__(self) -> bool:
        return bool(self.boxes)

    def specs(self) -> list[dict[str, Any]]:
        return [spec for box in self.boxes for spec in box.specs()]

    def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        for box in self.boxes:
            if any(spec["name"] == name for spec in box.specs()):
                return box.call(name, arguments)
        return f"error: unknown tool {name!r}"
