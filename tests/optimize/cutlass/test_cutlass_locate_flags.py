"""Locating the CUTLASS headers and the build flags per architecture."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.cutlass import flags as flags_module
from pytest_kernelpro.optimize.cutlass import locate as locate_module
from pytest_kernelpro.optimize.cutlass.flags import (
    build_flags,
    gencode_flag,
    parse_arch,
    target_arch,
)
from pytest_kernelpro.optimize.cutlass.locate import install_from_root, locate_cutlass


def make_tree(root: Path, version: tuple[int, int, int] | None = (4, 2, 1)) -> Path:
    inc = root / "include"
    (inc / "cutlass").mkdir(parents=True)
    (inc / "cute").mkdir()
    (inc / "cutlass" / "cutlass.h").write_text("#pragma once\n")
    if version:
        major, minor, patch = version
        (inc / "cutlass" / "version.h").write_text(
            f"#define CUTLASS_MAJOR {major}\n#define CUTLASS_MINOR {minor}\n"
            f"#define CUTLASS_PATCH {patch}\n"
        )
    return root


def test_cutlass_path_checkout_or_include_dir(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "cutlass")
    (root / "tools" / "util" / "include").mkdir(parents=True)
    lookup = locate_cutlass({"CUTLASS_PATH": str(root)})
    assert lookup
    assert lookup.install is not None
    install = lookup.install
    assert install.version == "4.2.1"
    assert install.source == "CUTLASS_PATH"
    assert install.include_dirs == (
        (root / "include").resolve(),
        (root / "tools" / "util" / "include").resolve(),
    )
    assert install.describe() == f"CUTLASS 4.2.1 from CUTLASS_PATH: {(root / 'include').resolve()}"
    via_include = locate_cutlass({"CUTLASS_PATH": str(root / "include")})
    assert via_include.install is not None
    assert via_include.install.root == root.resolve()


def test_bad_cutlass_path_is_reported_not_replaced(tmp_path: Path) -> None:
    lookup = locate_cutlass({"CUTLASS_PATH": str(tmp_path)})
    assert not lookup
    assert lookup.install is None
    assert "has no include/cutlass/cutlass.h" in lookup.reason
    assert str(tmp_path) in lookup.reason


def test_wheel_layout_and_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_tree(tmp_path / "cutlass_library" / "source", version=None)
    monkeypatch.setattr(locate_module, "_wheel_source_dir", lambda: source)
    lookup = locate_cutlass({})
    assert lookup.install is not None
    assert lookup.install.source == "nvidia-cutlass wheel"
    assert lookup.install.version is None
    assert "version unknown" in lookup.install.describe()
    monkeypatch.setattr(locate_module, "_wheel_source_dir", lambda: None)
    missing = locate_cutlass({})
    assert missing.install is None
    assert "CUTLASS_PATH is not set and the nvidia-cutlass wheel is not installed" in missing.reason
    assert install_from_root(tmp_path / "nothing", "x") is None


def test_arch_parsing_and_targets() -> None:
    assert parse_arch("sm_90a") == (90, "a")
    assert parse_arch("9.0") == (90, "")
    assert parse_arch((8, 9)) == (89, "")
    assert parse_arch(100) == (100, "")
    assert target_arch("sm_90") == "sm_90a"
    assert target_arch("sm_100") == "sm_100a"
    assert target_arch("sm_80") == "sm_80"
    assert target_arch("sm_89") == "sm_89"
    assert gencode_flag("sm_90") == "-gencode=arch=compute_90a,code=sm_90a"
    assert gencode_flag("8.0") == "-gencode=arch=compute_80,code=sm_80"
    with pytest.raises(KernelproError, match="'hopper' is not like"):
        parse_arch("hopper")


def test_build_flags(tmp_path: Path) -> None:
    install = install_from_root(make_tree(tmp_path / "c"), "CUTLASS_PATH")
    flags = build_flags("sm_90", install)
    assert flags.arch == "sm_90a"
    assert flags.cuda_flags[: len(flags_module.BASE_CUDA_FLAGS)] == flags_module.BASE_CUDA_FLAGS
    assert "-std=c++17" in flags.cuda_flags
    assert "--expt-relaxed-constexpr" in flags.cuda_flags
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags.cuda_flags
    include = str((tmp_path / "c" / "include").resolve())
    assert flags.include_dirs == (include,)
    assert flags.host_flags == ("-std=c++17",)
    assert build_flags("sm_80").include_dirs == ()
