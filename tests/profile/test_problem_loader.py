"""`load_problem` rebuilds an item's problem in another process from its file and qualified
name; a name the file no longer has, or an object without the marker, is an error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.problem import ProblemLocator
from pytest_kernelpro.profile.problem_loader import load_problem, lookup_qualname

SOURCE = """
import pytest


class Ops:
    @staticmethod
    @pytest.mark.kernelpro(reference=abs, inputs=lambda device: (1,), shapes=[(2,), (3,)])
    def scaled(x):
        return x


def plain(x):
    return x
"""


@pytest.fixture
def kernels(tmp_path: Path) -> str:
    path = tmp_path / "test_located.py"
    path.write_text(SOURCE, encoding="utf-8")
    return str(path)


def test_a_nested_kernel_is_found_at_its_shape(kernels: str) -> None:
    problem = load_problem(ProblemLocator(path=kernels, qualname="Ops.scaled", shape_index=1))
    assert problem.display_name == "Ops.scaled[3]"


@pytest.mark.parametrize(
    ("qualname", "said"),
    [
        ("Ops.gone", "has no Ops.gone"),
        ("Gone.scaled", "has no Gone.scaled"),
        ("plain", "plain in .* carries no @pytest.mark.kernelpro"),
    ],
)
def test_a_missing_or_unmarked_name_is_named(kernels: str, qualname: str, said: str) -> None:
    with pytest.raises(KernelproConfigError, match=said):
        load_problem(ProblemLocator(path=kernels, qualname=qualname))


def test_lookup_qualname_walks_attributes_and_says_none_for_a_missing_part() -> None:
    namespace = type("N", (), {"inner": type("I", (), {"value": 3})})
    assert lookup_qualname(namespace, "inner.value") == 3
    assert lookup_qualname(namespace, "inner.missing") is None
    assert lookup_qualname(namespace, "missing.value") is None
