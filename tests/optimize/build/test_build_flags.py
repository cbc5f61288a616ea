"""Flags a candidate passes to a compiler or linker (build/flags.py): an allow-list, refused by
name before anything is written into build.ninja; and the builds ahead run their compiler in
the candidates' sandbox (a compile that includes a file outside it cannot read it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from buildkit import ADD_SOURCE, ARCH

from pytest_kernelpro.optimize.build.cache import BuildCache, BuildError, CacheableBuildError
from pytest_kernelpro.optimize.build.extension import build_extension, cached_load_inline
from pytest_kernelpro.optimize.build.flags import (
    check_cuda_flags,
    check_host_flags,
    check_include_paths,
    check_ldflags,
)
from pytest_kernelpro.optimize.build.nvcc import compile_cubin

# What an attacker passes: shell syntax (ninja runs each line through a shell), and options
# that load or write what the candidate names.
HOSTILE = {
    "extra_cflags": [
        "-O2; touch /tmp/pwned",
        "-O2 && curl x",
        "-DX=$(id)",
        "-DX=`id`",
        "-O2\nrule x",
        "-DX=a b",
        "-fplugin=/tmp/evil.so",
        "-B/tmp/evil",
        "-specs=/tmp/evil.specs",
        "@/tmp/flags",
        "-o/tmp/out",
        "-Wl,-rpath,/tmp",
        "-Xlinker",
        "-include/etc/passwd",
        "-I/root/.ssh",
        "-DX='$HOME'",
        "-wrapper=/bin/sh",
        "-Wp,-MD,/tmp/x",
    ],
    "extra_cuda_cflags": [
        "--compiler-bindir=/tmp/evil",
        "-ccbin=/tmp/evil",
        "-Xcompiler=-fplugin=/tmp/evil.so",
        "-Xcompiler=-O2;id",
        "--output-directory=/tmp",
        "-O3 $(id)",
        "--keep-dir=/tmp",
        "-Xlinker=-rpath",
        "--linker-options=-T/tmp/x",
        "--run",
        "-odir=/tmp",
    ],
    "extra_include_paths": ["relative/dir", "/tmp/a b", "/tmp/$(id)", "/tmp/../root", "/a;b"],
    "extra_ldflags": ["-lfoo", "-Wl,-rpath,/tmp", "-Xlinker", "/tmp/evil.so", "-L/tmp;id"],
}
CHECKERS = {
    "extra_cflags": check_host_flags,
    "extra_cuda_cflags": check_cuda_flags,
    "extra_include_paths": check_include_paths,
    "extra_ldflags": check_ldflags,
}
SAFE = {
    "extra_cflags": ["-O3", "-std=c++17", "-DNDEBUG", "-DBLOCK=256", "-fopenmp", "-Wall", "-w"],
    "extra_cuda_cflags": [
        "-O3",
        "--use_fast_math",
        "-Xptxas",
        "-v",
        "-Xptxas=-O3,-v",
        "-lineinfo",
        "-gencode=arch=compute_90a,code=sm_90a",
        "--expt-relaxed-constexpr",
        "-DTILE=64",
        "-maxrregcount=128",
    ],
    "extra_include_paths": ["/usr/local/cuda/include", "/opt/cutlass-3.5/include"],
    "extra_ldflags": ["-lcublas", "-lcuda", "-L/usr/local/cuda/lib64"],
}


@pytest.mark.parametrize(
    ("keyword", "flag"), [(k, f) for k, flags in HOSTILE.items() for f in flags]
)
def test_a_hostile_flag_is_refused_by_name(keyword: str, flag: str) -> None:
    with pytest.raises(CacheableBuildError) as raised:
        CHECKERS[keyword]([SAFE[keyword][0], flag], keyword)  # after an allowed one
    assert f"{flag!r} in {keyword} is not allowed" in raised.value.message


@pytest.mark.parametrize("keyword", sorted(SAFE))
def test_ordinary_flags_pass(keyword: str) -> None:
    assert CHECKERS[keyword](SAFE[keyword], keyword) == SAFE[keyword]


def test_a_pair_option_needs_an_allowed_value() -> None:
    with pytest.raises(CacheableBuildError, match="'-Xptxas --evil'"):
        check_cuda_flags(["-Xptxas", "--evil"])
    with pytest.raises(CacheableBuildError, match="'-Xcompiler'"):
        check_cuda_flags(["-Xcompiler"])


def test_refused_before_build_ninja_is_written(tmp_path: Path) -> None:
    # No compiler needed: the refusal comes first, and nothing is built or cached.
    marker = tmp_path / "pwned"
    cache = BuildCache(tmp_path / "cache", writable=True)
    with pytest.raises(CacheableBuildError, match="in extra_cflags is not allowed"):
        build_extension(
            "x", "int f();", "__global__ void k() {}", ["f"],
            extra_cflags=[f"-O2; touch {marker}"], cache=cache,
        )  # fmt: skip
    assert not marker.exists()
    assert not (tmp_path / "cache").exists()


def test_calls_that_go_to_torch_are_checked_too() -> None:
    def original(*args, **kwargs):  # torch's load_inline: must never be reached
        raise AssertionError("a refused flag reached torch")

    patched = cached_load_inline(original)
    with pytest.raises(BuildError, match="'-Wl,-rpath,/tmp' in extra_ldflags"):
        patched("x", "int f();", None, extra_ldflags=["-Wl,-rpath,/tmp"])
    with pytest.raises(BuildError, match="in extra_cflags"):
        patched("x", "int f();", None, with_cuda=False, extra_cflags=["-O2;id"])


def test_a_confined_compile_finds_this_package_without_an_install(tmp_path: Path) -> None:
    """The sandbox's setup is `python -m pytest_kernelpro...` before the compiler: where the
    package is importable only through PYTHONPATH (the GPU machine), the compile's
    environment must carry it (seen there: "No module named 'pytest_kernelpro'")."""
    import pytest_kernelpro
    from pytest_kernelpro.optimize.build.cache import confined_env

    env = confined_env(tmp_path)
    root = str(Path(pytest_kernelpro.__file__).resolve().parents[1])
    assert env["PYTHONPATH"].split(":")[0] == root
    assert env["HOME"] == str(tmp_path / ".home")
    assert env["TMPDIR"] == str(tmp_path / ".tmp")


def test_a_build_sandbox_that_does_not_start_is_not_cached_as_a_compile_error(
    tmp_path: Path,
) -> None:
    """Seen on the GPU machine: the sandbox's setup could not import this package, and the
    failure was cached as the candidate's compile error, so the worker never built it."""
    import sys

    def broken(command: list[str], scratch: Path, writable: list[Path]) -> list[str]:
        code = (
            "import sys; sys.stderr.write(\"No module named 'pytest_kernelpro'\\n\"); sys.exit(1)"
        )
        return [sys.executable, "-c", code]

    cache = BuildCache(tmp_path / "cache", writable=True)
    cache.confine = broken

    def produce(folder: Path) -> dict[str, str]:
        compile_cubin(ADD_SOURCE, folder, arch=ARCH, nvcc="nvcc", confine=cache.confine)
        return {}

    with pytest.raises(BuildError) as raised:
        cache.get_or_build("k" * 64, produce)
    assert not isinstance(raised.value, CacheableBuildError)
    assert raised.value.message.startswith("the build sandbox did not start (exit 1)")
    assert "No module named 'pytest_kernelpro'" in raised.value.message
    assert cache.lookup("k" * 64) is None  # the next build tries again


@pytest.mark.slow
def test_a_compile_built_ahead_cannot_read_outside_the_sandbox(
    nvcc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source that includes a secret file by absolute path: compiled as the search's
    builds ahead compile it (the evaluator's `confine_build`), the compiler finds no such
    file; compiled unconfined (the control), the secret is in the compiler's error."""
    from pytest_kernelpro.optimize.sandbox.evaluator import KernelBenchTask, SandboxEvaluator
    from pytest_kernelpro.optimize.sandbox.isolation import Isolation

    if not Isolation.probe().isolated:
        pytest.skip(f"no Linux namespaces here: {Isolation.probe().why}")
    home = tmp_path / "home"
    home.mkdir()
    secret = home / ".vault-token"
    secret.write_text("hvs_kp_compile_secret_4242 @@@\n")
    monkeypatch.setenv("HOME", str(home))
    reference = (Path(__file__).resolve().parents[2] / "data/search/cpu/reference.py").read_text()
    evaluator = SandboxEvaluator(KernelBenchTask(reference, name="r", device="cpu"))
    assert evaluator.build_cache.confine is not None
    source = f'#include "{secret}"\n{ADD_SOURCE}'

    def compile_in(folder: Path, confine) -> str:  # noqa: ANN001
        folder.mkdir()
        with pytest.raises(CacheableBuildError) as raised:
            compile_cubin(source, folder, arch=ARCH, nvcc=nvcc, confine=confine)
        return raised.value.log

    control = compile_in(tmp_path / "open", None)
    assert "hvs_kp_compile_secret_4242" in control  # the attack is real without the sandbox
    confined = compile_in(tmp_path / "confined", evaluator.confine_build)
    assert "hvs_kp_compile_secret_4242" not in confined
    assert "No such file or directory" in confined, confined
