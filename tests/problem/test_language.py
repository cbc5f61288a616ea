"""A kernel's language is found where its code leads, not only in the sources it names.

A user's test module often calls a library's `torch.autograd.Function` (`LigerSiLUMulFunction
.apply(a, b)`, as Liger-Kernel's ops are called), whose `forward` calls a launcher in another
module, which launches a `@triton.jit` kernel. No source on the way up names Triton, so the
kernel used to be taken for PyTorch: on a CPU it ran and failed inside Triton's driver
instead of being skipped as needing a GPU.

Triton is not installed where these tests run, so the library here launches an object of a
class whose module is `triton.runtime.jit`, the module of `@triton.jit`'s `JITFunction`:
the type is what the walk recognises.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.problem.language import detect_language_of  # noqa: E402

LAUNCH = '''
import functools


class JITFunction:
    """Stands for triton.runtime.jit.JITFunction."""

    def __getitem__(self, grid):
        return lambda *args: None


JITFunction.__module__ = "triton.runtime.jit"
_scale_kernel = JITFunction()


def scale_forward(x):
    _scale_kernel[(1,)](x)
    return x * 2


def torch_only(x):
    return torch_helper(x)


def torch_helper(x):
    return torch_only(x) if x is None else x + 1  # calls back: the walk must end


def contiguous(fn):
    @functools.wraps(fn)
    def wrapper(ctx, *args):
        return fn(ctx, *args)
    return wrapper
'''

FUNCTIONS = """
import torch
from torch import nn

from .launch import contiguous, scale_forward, torch_only


class ScaleFunction(torch.autograd.Function):
    @staticmethod
    @contiguous
    def forward(ctx, x):
        return scale_forward(x)


class Scale(nn.Module):
    def forward(self, x):
        return ScaleFunction.apply(x)


class Plain(nn.Module):
    def forward(self, x):
        return torch_only(x)
"""


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    package = tmp_path / "scalelib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch.py").write_text(textwrap.dedent(LAUNCH))
    (package / "functions.py").write_text(textwrap.dedent(FUNCTIONS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("scalelib.functions")
    for name in [m for m in sys.modules if m.split(".")[0] == "scalelib"]:
        del sys.modules[name]


def test_a_function_reaching_a_triton_kernel_through_an_autograd_function_is_triton(library):
    ScaleFunction = library.ScaleFunction

    def scale(x):
        return ScaleFunction.apply(x)

    assert detect_language_of(scale) == "triton"


def test_a_library_module_class_whose_forward_reaches_a_triton_kernel_is_triton(library):
    assert detect_language_of(library.Scale) == "triton"


def test_a_library_chain_that_reaches_no_compiled_kernel_stays_pytorch(library):
    # Plain -> torch_only <-> torch_helper: a cycle with nothing compiled on it.
    assert detect_language_of(library.Plain) == "pytorch"

    def plain(x):
        return torch.relu(x)

    assert detect_language_of(plain) == "pytorch"


# ----- library objects: a layer instance, its children, helper modules, extensions -----
# tests/data/triton_standin holds a stand-in `triton` package (Triton is not installed here):
# `triton.jit` and `triton.autotune` make objects of classes in `triton.runtime.jit` /
# `triton.runtime.autotuner`, as the real package does, and launching one fails as Triton
# does on a machine without a GPU. Its `normlib` is a library whose only module naming
# triton is `kernels.py`; `ops.py` reads the kernel as an attribute of that module, and
# `layers.py` has layers calling it (`Block`), a wrapper of a child given to its constructor
# (`Wrapper`), a kernel kept as an attribute (`Launcher`) and a torch-only layer.
STANDIN = Path(__file__).resolve().parents[1] / "data" / "triton_standin"


@pytest.fixture
def normlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import shutil

    shutil.copytree(STANDIN, tmp_path / "standin")
    monkeypatch.syspath_prepend(str(tmp_path / "standin"))
    yield importlib.import_module("normlib.layers")
    for name in [m for m in sys.modules if m.split(".")[0] in ("normlib", "triton")]:
        del sys.modules[name]


def test_a_function_calling_a_layer_object_whose_child_launches_triton_is_triton(normlib):
    # layer -> Wrapper.forward -> self.block (a child in _modules) -> Block.forward ->
    # ops (an imported helper module) .norm_forward -> kernels._norm_kernel (an Autotuner)
    layer = normlib.Wrapper(normlib.make_block())

    def norm(x):
        return layer(x)

    assert detect_language_of(norm) == "triton"


def test_a_kernel_object_kept_as_an_attribute_is_triton(normlib):
    import normlib.kernels as kernels

    launcher = normlib.Launcher(kernels._norm_kernel)

    def launch(x):
        return launcher(x)

    assert detect_language_of(launch) == "triton"


def test_a_layer_object_that_only_uses_torch_stays_pytorch(normlib):
    # The attack on over-detection: the same shapes of objects with nothing compiled.
    stack = torch.nn.Sequential(torch.nn.Linear(4, 4), normlib.Wrapper(normlib.TorchBlock()))

    def plain(x):
        return stack(x)

    assert detect_language_of(plain) == "pytorch"


def test_a_torch_container_of_library_layers_is_followed(normlib):
    stack = torch.nn.Sequential(torch.nn.Linear(4, 4), normlib.Block())

    def forward(x):
        return stack(x)

    assert detect_language_of(forward) == "triton"


EXTENSION_CU = r"""
#include <Python.h>
__global__ void twice(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] *= 2.0f; }
static PyObject* launch(PyObject*, PyObject*) { twice<<<1, 1>>>(nullptr, 0); Py_RETURN_NONE; }
static PyMethodDef methods[] = {{"launch", launch, METH_NOARGS, "launch"}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "NAME", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&mod); }
"""

HOST_ONLY_C = r"""
#include <Python.h>
static PyObject* launch(PyObject* self, PyObject* args) { Py_RETURN_NONE; }
static PyMethodDef methods[] = {{"launch", launch, METH_NOARGS, "launch"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&mod); }
"""


def _compile_extension(tmp_path: Path, name: str, compiler: str, source: str) -> Any:
    import importlib.machinery
    import shutil
    import subprocess
    import sysconfig

    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    src = tmp_path / (name + (".cu" if compiler == "nvcc" else ".c"))
    src.write_text(source.replace("NAME", name))
    out = tmp_path / (name + importlib.machinery.EXTENSION_SUFFIXES[0])
    flags = ["-Xcompiler", "-fPIC"] if compiler == "nvcc" else ["-fPIC"]
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        [compiler, "-shared", *flags, f"-I{include}", str(src), "-o", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


@pytest.mark.slow
def test_a_callable_reaching_a_compiled_cuda_extension_is_cuda(tmp_path: Path) -> None:
    """A real nvcc build: the extension's shared object carries device code, and a layer
    object whose forward calls its function is CUDA."""
    ext = _compile_extension(tmp_path, "kp_lang_cuda_ext", "nvcc", EXTENSION_CU)

    class Layer(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, x):
            self.fn()
            return x

    layer = Layer(ext.launch)

    def kernel(x):
        return layer(x)

    assert detect_language_of(kernel) == "cuda"

    def by_module(x):
        ext.launch()
        return x

    assert detect_language_of(by_module) == "cuda"


@pytest.mark.slow
def test_a_host_only_c_extension_stays_pytorch(tmp_path: Path) -> None:
    """The attack on over-detection: a compiled extension without device code is not CUDA."""
    ext = _compile_extension(tmp_path, "kp_lang_host_ext", "gcc", HOST_ONLY_C)

    def kernel(x):
        ext.launch()
        return x

    assert detect_language_of(kernel) == "pytorch"


def _marked_problem(kernel: Any, **marker: Any) -> Any:
    from pytest_kernelpro.problem import MarkerOptions, problem_from_marker

    options = MarkerOptions.from_marker(
        (), {"reference": abs, "inputs": lambda device: (1,), **marker}, kernel_name="k"
    )
    return problem_from_marker(kernel, options, name="k", source_file="test_k.py")


def test_collection_reads_no_source_and_the_item_detects_its_language(library, monkeypatch):
    """A module's other kernels are collected before `-k` or a node id selects one: their
    sources are read only if they run. The item that runs gets the language its code leads to
    (and with it the GPU it needs), each shape's item on its own."""
    import pytest_kernelpro.problem.model as model

    asked: list[Any] = []
    detect = model.detect_language_of
    monkeypatch.setattr(model, "detect_language_of", lambda obj: asked.append(obj) or detect(obj))
    ScaleFunction = library.ScaleFunction

    def scale(x):
        return ScaleFunction.apply(x)

    problem = _marked_problem(scale, shapes=[(2, 3), (4, 5)])
    shapes = problem.at_shapes()
    assert [p.display_name for p in shapes] == ["k[2x3]", "k[4x5]"]
    assert asked == []
    assert shapes[0].language == "triton"
    assert shapes[0].device_preference == "cuda"
    assert shapes[0].language == "triton"
    assert asked == [scale]  # once per item, not per question


def test_a_given_language_or_device_is_never_detected(library, monkeypatch):
    import pytest_kernelpro.problem.model as model

    def refuse(obj: Any) -> str:
        raise AssertionError(f"detected the language of {obj!r}")

    monkeypatch.setattr(model, "detect_language_of", refuse)
    assert _marked_problem(library.Scale, language="pytorch").device_preference == "any"
    assert _marked_problem(library.Scale, language="cuda").device_preference == "cuda"
    assert _marked_problem(library.Scale, device="cpu").device_preference == "cpu"


def test_device_code_is_found_anywhere_in_an_extension_file(tmp_path: Path) -> None:
    """nvcc's marks are found wherever they lie (across a megabyte's edge, at the end), and
    nothing is found in a file without them, an empty one or a missing one."""
    from pytest_kernelpro.problem import language

    cases = {
        "at_a_megabyte_edge.so": b"\0" * ((1 << 20) - 5) + b".nv_fatbin" + b"\0" * 64,
        "registration_at_the_end.so": b"\1" * 3_000_000 + b"__cudaRegisterFatBinary",
        "host_only.so": b"\0" * 2_000_000 + b".text .data __libc_start_main",
        "empty.so": b"",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    found = {name: language._has_device_code(str(tmp_path / name)) for name in cases}
    found["missing.so"] = language._has_device_code(str(tmp_path / "missing.so"))
    assert found == {
        "at_a_megabyte_edge.so": True,
        "registration_at_the_end.so": True,
        "host_only.so": False,
        "empty.so": False,
        "missing.so": False,
    }
