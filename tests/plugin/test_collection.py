"""Collection: marked functions and classes, shapes, KernelBench files, marker errors."""

from __future__ import annotations

import pytest

from pytest_kernelpro.config import GROUP_DESCRIPTION

KERNELS = """
import pytest, torch

def inputs(device):
    return (torch.randn(64, 32, device=device),)

def shaped(device, shape):
    return (torch.randn(*shape, device=device),)

@pytest.mark.kernelpro(reference=lambda x: torch.relu(x), inputs=inputs)
def relu(x):
    return x.clamp_min(0)

@pytest.mark.kernelpro(reference=lambda x: x * 2, inputs=shaped, shapes=[(8192, 4096), (16, 16)])
def double(x):
    return x + x

class Ref(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 16)
    def forward(self, x):
        return torch.relu(self.lin(x))

@pytest.mark.kernelpro(reference=Ref, inputs=inputs, rtol=1e-4, atol=1e-5)
class Fused(Ref):
    def forward(self, x):
        return self.lin(x).clamp_min(0)

def test_ordinary():
    assert True
"""


def test_marked_functions_classes_and_shapes_become_items(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_kernels=KERNELS)
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "test_kernels.py::relu",
            "test_kernels.py::double[8192x4096]",
            "test_kernels.py::double[16x16]",
            "test_kernels.py::Fused",
            "test_kernels.py::test_ordinary",
            "*5 tests collected*",
        ]
    )


def test_kernelpro_only_deselects_ordinary_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_kernels=KERNELS)
    result = pytester.runpytest("--collect-only", "-q", "--kernelpro-only")
    result.stdout.fnmatch_lines(["*4/5 tests collected (1 deselected)*"])


def test_imported_kernel_is_collected_only_where_defined(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_a="""
        import pytest, torch
        @pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.ones(4),))
        def negate(x):
            return -x
        """,
        test_b="from test_a import negate\n",
    )
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["test_a.py::negate", "*1 test collected*"])


def test_kernel_marked_in_a_library_module_is_collected_where_imported(
    pytester: pytest.Pytester,
) -> None:
    # pytest never collects mykernels/ops.py, so a kernel decorated there (or a library class
    # marked by assignment in the test module) must be collected by the test module.
    pytester.makepyfile(
        **{
            "mykernels/__init__.py": "",
            "mykernels/ops.py": """
            import pytest, torch
            @pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.ones(4),))
            def negate(x):
                return -x

            class Double(torch.nn.Module):
                def forward(self, x):
                    return x * 2
            """,
            "test_ops.py": """
            import pytest, torch
            from mykernels.ops import negate, Double

            class Ref(torch.nn.Module):
                def forward(self, x):
                    return x + x

            double = pytest.mark.kernelpro(
                reference=Ref, inputs=lambda device: (torch.ones(4, device=device),)
            )(Double)
            """,
        }
    )
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "-q",
        "--rootdir",
        str(pytester.path),
        "-o",
        "pythonpath=.",
        "test_ops.py",
    )
    result.stdout.fnmatch_lines(["*2 passed*"])
    assert result.ret == 0
    collected = pytester.runpytest("--collect-only", "-q", "-o", "pythonpath=.", "test_ops.py")
    collected.stdout.fnmatch_lines(
        ["test_ops.py::negate", "test_ops.py::double", "*2 tests collected*"]
    )


def test_a_kernel_defined_here_and_bound_twice_is_one_item_under_its_own_name(
    pytester: pytest.Pytester,
) -> None:
    # A class marked by assignment under another name, and a decorated kernel with an
    # alias, are one kernel each: they were collected twice, once per name.
    pytester.makepyfile(
        test_twice="""
        import pytest, torch

        def inp(device):
            return (torch.ones(4, device=device),)

        class Fused(torch.nn.Module):
            def forward(self, x):
                return x * 2

        class Ref(torch.nn.Module):
            def forward(self, x):
                return x + x

        fused = pytest.mark.kernelpro(reference=Ref, inputs=inp)(Fused)

        @pytest.mark.kernelpro(reference=torch.neg, inputs=inp)
        def negate(x):
            return -x

        negate_v1 = negate
        """
    )
    collected = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    collected.stdout.fnmatch_lines(
        ["test_twice.py::Fused", "test_twice.py::negate", "*2 tests collected*"]
    )


@pytest.mark.parametrize(
    ("marker_args", "expected"),
    [
        (
            "reference=torch.neg, inputs=inp, rtoll=1e-3",
            "*unknown keyword(s) rtoll (did you mean rtol?); valid keywords are reference, inputs*",
        ),
        (
            "reference=torch.neg, inputs=inp, rtol='tight'",
            "*rtol='tight' is invalid; rtol must be a number >= 0*",
        ),
        ("inputs=inp", "*missing reference=; pass a callable or nn.Module class*"),
        (
            "reference=torch.neg, inputs=inp, min_roofline=60",
            "*min_roofline=60 is invalid; min_roofline must be a fraction in (0, 1]*",
        ),
        (
            "reference=torch.neg, inputs=inp, language='cobol'",
            "*language='cobol' is invalid; language must be one of pytorch, triton, cuda*",
        ),
        ("reference=torch.neg, inputs=inp, shapes=[]", "*shapes=[] is invalid*"),
    ],
)
def test_bad_marker_is_a_clear_error_of_that_kernel_only(
    pytester: pytest.Pytester, marker_args: str, expected: str
) -> None:
    pytester.makepyfile(
        test_bad=f"""
        import pytest, torch
        def inp(device):
            return (torch.ones(4, device=device),)
        @pytest.mark.kernelpro({marker_args})
        def broken(x):
            return -x
        def test_other():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*@pytest.mark.kernelpro on 'broken'*" + expected.lstrip("*")])
    result.assert_outcomes(passed=1, failed=1)


def test_positional_marker_arguments_are_rejected(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_pos="""
        import pytest, torch
        @pytest.mark.kernelpro("torch.neg", 1)
        def broken(x):
            return -x
        """
    )
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*positional arguments*are not accepted*"])
    result.assert_outcomes(failed=1)


KERNELBENCH = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
    def forward(self, x):
        return torch.relu(x) * self.scale

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
    def forward(self, x):
        return x.clamp_min(0) * self.scale

def get_inputs():
    return [torch.randn(128, 64)]

def get_init_inputs():
    return [3.0]
"""


@pytest.mark.parametrize("how", ["cli", "ini"])
def test_kernelbench_directory_is_collected(pytester: pytest.Pytester, how: str) -> None:
    problems = pytester.mkdir("problems")
    (problems / "19_ReLU.py").write_text(KERNELBENCH)
    (problems / "helper.py").write_text("X = 1\n")
    args = ["--collect-only", "-q"]
    if how == "cli":
        args.append("--kernelpro-problems=problems")
    else:
        pytester.makeini("[pytest]\nkernelpro_problems = problems\n")
    result = pytester.runpytest(*args)
    result.stdout.fnmatch_lines(["problems/19_ReLU.py::19_ReLU", "*1 test collected*"])


def test_missing_problems_directory_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kernelpro-problems=nope")
    result.stderr.fnmatch_lines(["*problems directory*nope*does not exist*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_help_shows_the_option_group(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(
        [
            f"{GROUP_DESCRIPTION}:",
            "*--kernelpro-check*",
            "*--kernelpro-threshold=FRACTION*",
            "*--kernelpro-baseline=PATH*",
            "*kernelpro_threshold (string):*",
        ]
    )


def test_marker_is_registered_with_its_signature(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.kernelpro(reference, inputs, rtol=None, atol=None, flops=None, bytes=None, min_roofline=None, threshold=None, source=None, language=None, shapes=None*"
        ]
    )
