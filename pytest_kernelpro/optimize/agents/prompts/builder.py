"""PromptBuilder: Programmer prompts composed from reusable parts.

System prompt = role and rules + base optimization strategies + GPU injection (+ CUTLASS
constraints). User prompt = input-format part (pytorch / triton / cuda) + the reference +
[reference analysis] + mode part (initial / debug with the failure / optimize with the
profiler feedback) + curated example (initial mode) + output contract [+ the concise
directive of truncation recovery, Phase B].

Parts are Markdown files in `parts/` (override any of them by name with `overrides=`);
`$name` fields are filled with `string.Template`, so C++ braces need no escaping.

`prompt_id` = "<template>@<hash>": the template is "<mode>.<language>" and the hash (10 hex
digits of SHA-256) covers the static text that shaped the prompt (the parts used, the GPU
injection), not the problem or the parent's code, so candidates produced by the same
template version share an id and an edited part yields a new one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

from pytest_kernelpro.errors import KernelproConfigError, KernelproError

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.agents.prompts.gpu import GpuContext

PARTS_DIR = Path(__file__).with_name("parts")
LANGUAGES = ("pytorch", "triton", "cuda")
MODES = ("initial", "debug", "optimize")


@dataclass(frozen=True)
class Prompt:
    """A built prompt."""

    system: str
    user: str
    prompt_id: str
    template: str
    parts: tuple[str, ...]
    # Characters at the head of `user` that do not depend on the node (input format, the
    # problem, the reference analysis): what a backend may mark for prompt caching.
    stable_chars: int = 0


def check_language(language: str) -> str:
    """Normalize and check a problem language ("PyTorch" -> "pytorch")."""
    value = (language or "").strip().lower()
    if value == "torch":
        value = "pytorch"
    if value not in LANGUAGES:
        raise KernelproConfigError(
            f"Unknown kernel language {language!r}; use one of {', '.join(LANGUAGES)}"
        )
    return value


def code_block(code: str, lang: str = "python") -> str:
    """`code` in a fence longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{code.rstrip()}\n{fence}"


def _feedback_note(feedback: str | None) -> str:
    """What the optimize task says about the text after it (nothing when nothing follows)."""
    text = feedback or ""
    if "## Automated Bottleneck Analysis" in text or "## Profiling analysis" in text:
        return "Use the profile and its analysis that follow to choose what to change."
    if "## Profiling tools (on request)" in text:
        return "Its profile is available through the profiling tools described below."
    if "## Profiler Metrics (raw)" in text:
        return "The profiler's counters for it follow."
    return "No profile of it is given: reason from its code and the reference analysis."


class PromptBuilder:
    """Composes Programmer prompts (see the module doc)."""

    def __init__(
        self,
        parts_dir: str | Path | None = None,
        *,
        overrides: Mapping[str, str] | None = None,
        examples: bool = True,
    ) -> None:
        self.parts_dir = Path(parts_dir) if parts_dir is not None else PARTS_DIR
        self.overrides = dict(overrides or {})
        self.examples = examples
        self._cache: dict[str, str] = {}

    def part(self, name: str) -> str:
        """The text of part `name` (an override, else `parts/<name>.md`)."""
        if name in self.overrides:
            return self.overrides[name]
        if name not in self._cache:
            path = self.parts_dir / f"{name}.md"
            try:
                self._cache[name] = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise KernelproError(
                    f"prompt part {name!r} not found ({path}: {exc}); restore it or pass "
                    f"overrides={{{name!r}: ...}}"
                ) from None
        return self._cache[name]

    def gpu_context(self, device_name: str | None, **options: object) -> GpuContext:
        """The GPU injection for `device_name` (see `prompts.gpu.gpu_context`)."""
        from pytest_kernelpro.optimize.agents.prompts.gpu import gpu_context

        return gpu_context(device_name, **options)  # type: ignore[arg-type]

    def build(
        self,
        mode: str,
        *,
        language: str,
        problem_source: str,
        n_candidates: int,
        gpu: GpuContext | None = None,
        parent_code: str | None = None,
        failure: str | None = None,
        feedback: str | None = None,
        speedup: str = "",
        reference_analysis: str | None = None,
        concise: bool = False,
        problem_md: str | None = None,
    ) -> Prompt:
        """The prompt for one Programmer call.

        `failure` (debug) is the rendered error details; `feedback` (optimize) the profiling
        text (tools guidance, Profiling Agent analysis, raw metrics, or nothing); `speedup`
        one sentence on the parent's speed; `reference_analysis` the Benchmarking Agent's
        roofline text; `concise` appends the Phase B directive. `problem_md`, when given, is
        the rendered `ProblemContext` (the reference as written, the current kernel, the
        inputs) and replaces the bare `problem_source` block.
        """
        if mode not in MODES:
            raise KernelproError(f"Unknown Programmer mode {mode!r}; use one of {MODES}")
        language = check_language(language)
        if n_candidates < 1:
            raise KernelproError(f"n_candidates={n_candidates} must be at least 1")
        if mode != "initial" and not parent_code:
            raise KernelproError(f"{mode} mode needs the parent solution's code")
        used = ["system", "strategies"]
        system = [self.part("system").rstrip(), self.part("strategies").rstrip()]
        if gpu is not None:
            system.append(gpu.text.rstrip())
        problem = problem_md.rstrip() if problem_md else code_block(problem_source)
        user = [self.part(f"format_{language}").rstrip(), problem]
        used.append(f"format_{language}")
        if reference_analysis:
            user.append(reference_analysis.rstrip())
        fields = {
            "parent_block": code_block(parent_code or ""),
            "failure": (failure or "No details were recorded.").rstrip(),
            "speedup_line": speedup,
            "feedback_note": _feedback_note(feedback),
            "n": str(n_candidates),
        }
        stable_chars = len("\n\n".join(user)) + 2
        user.append(Template(self.part(f"mode_{mode}")).safe_substitute(fields).rstrip())
        used.append(f"mode_{mode}")
        if mode == "optimize" and feedback and feedback.strip():
            user.append(feedback.rstrip())
        # The curated example is CUDA: it shows the form, and only helps on a GPU target.
        if mode == "initial" and self.examples and (gpu is None or not gpu.is_cpu):
            user.append(self.part("example_load_inline").rstrip())
            used.append("example_load_inline")
        # How candidates are built (pytest_kernelpro.optimize.build): the fast path's form, every mode.
        if gpu is None or not gpu.is_cpu:
            user.append(self.part("build_form").rstrip())
            used.append("build_form")
        user.append(Template(self.part("output_format")).safe_substitute(fields).rstrip())
        used.append("output_format")
        if concise:
            user.append(self.part("concise").rstrip())
            used.append("concise")
        template = f"{mode}.{language}"
        digest = hashlib.sha256()
        for name in used:
            digest.update(name.encode() + b"\0" + self.part(name).encode() + b"\0")
        if gpu is not None:
            digest.update(gpu.text.encode())
        prompt_id = f"{template}@{digest.hexdigest()[:10]}"
        return Prompt(
            system="\n\n".join(system) + "\n",
            user="\n\n".join(user) + "\n",
            prompt_id=prompt_id,
            template=template,
            parts=tuple(used),
            stable_chars=stable_chars,
        )
