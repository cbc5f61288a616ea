"""Orchestration and the report section: kernel selection, a CPU-only profile of a real
captured module, and the rendered text of real H200 numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kernelpro.profile.collect import profile_kernel_item, select_kernels
from pytest_kernelpro.profile.metrics_catalog import CURATED_METRICS
from pytest_kernelpro.profile.model import KernelProfile, NotCollected, ProfileReport
from pytest_kernelpro.profile.ncu_csv import first_launch_per_kernel, parse_ncu_raw_csv
from pytest_kernelpro.profile.ptxas import parse_ptxas_output, ptxas_by_function
from pytest_kernelpro.profile.render import derived_metrics, format_value, render_profile_section
from pytest_kernelpro.profile.sass import summarize_sass
from pytest_kernelpro.profile.timeline import summarize_events

DATA = Path(__file__).resolve().parent.parent / "data" / "profile"
PROBE_ENTRIES = [
    "_Z18wmma_matmul_kernelPK6__halfS1_Pfi",
    "_Z12spill_kernelPKfPfPKii",
    "_Z20naive_softmax_kernelPKfPfii",
]


class Locator:
    path = "kernels_test.py"
    qualname = "scale"
    shape_index = None


def test_selection_keeps_the_entry_points_that_ran() -> None:
    observed = {  # kineto's demangled names, largest first
        "naive_softmax_kernel(float const*, float*, int, int)": 1380.0,
        "void at::native::vectorized_elementwise_kernel<4>(int)": 20.0,
        "spill_kernel(float const*, float*, int const*, int)": 199.0,
    }
    selector, fell_back = select_kernels(PROBE_ENTRIES, observed)
    assert not fell_back
    assert selector.base == "mangled"
    assert selector.names == ("_Z20naive_softmax_kernelPKfPfii", "_Z12spill_kernelPKfPfPKii")


def test_selection_falls_back_to_the_longest_kernels() -> None:
    observed = {
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": 25.7,
        "void at::vectorized_elementwise_kernel<8, at::bfloat16_copy_kernel_cuda>(int)": 3.0,
        "void at::reduce_kernel<512, 1>(T3)": 0.5,
    }
    selector, fell_back = select_kernels(PROBE_ENTRIES, observed)
    assert fell_back  # the item had modules, but none of their kernels ran
    assert selector.base == "function"
    # 25.7 of 29.2 µs is under 90 %, so the second-longest joins; the 0.5 µs one does not
    assert selector.names == (
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
        "vectorized_elementwise_kernel",
    )
    selector, fell_back = select_kernels([], observed)
    assert not fell_back
    assert selector.base == "function"
    # no trace: all entry points; nothing known: the whole NVTX range
    assert select_kernels(PROBE_ENTRIES, None)[0].names == tuple(PROBE_ENTRIES)
    assert select_kernels([], None) == (None, False)


def test_cpu_profile_of_a_captured_module(built_extension, tool_or_skip) -> None:
    tool_or_skip("cuobjdump")
    tool_or_skip("nvdisasm")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU path")
    (build,) = built_extension.capture.builds
    report = profile_kernel_item(
        Locator(), so_paths=[build.so_path], device="cuda", timeout_s=60, ptxas=build.ptxas
    )
    (kernel,) = report.kernels
    assert kernel.name.startswith("scale_kernel(")
    assert kernel.metrics is None
    assert kernel.sass is not None
    assert kernel.sass.count("FMUL") == 1
    assert kernel.ptxas is not None
    assert kernel.ptxas.function == "_Z12scale_kernelPffi"
    assert report.arch == "sm_90a"
    reasons = {n.what: n.why for n in report.not_collected}
    assert "no CUDA device" in reasons["ncu"]
    assert "no CUDA device" in reasons["timeline"]
    assert report.linkage is not None
    assert not report.linkage.cublas
    assert any(lib.startswith("libcudart") for lib in report.linkage.libraries)
    assert report.wall_s > 0
    text = render_profile_section(report)
    assert "kernel scale_kernel(" in text
    assert "sass: " in text
    assert "ptxas (sm_90a): " in text
    assert "not collected: ncu: no CUDA device" in text
    assert report.to_dict()["kernels"][0]["ptxas"]["registers"] == kernel.ptxas.registers


def test_cpu_device_and_missing_module() -> None:
    report = profile_kernel_item(Locator(), so_paths=["/nonexistent/mod.so"], device="cpu")
    whats = [n.what for n in report.not_collected]
    assert "ncu" in whats
    assert "timeline" in whats
    assert any(n.what in {"symbols", "sass", "linkage"} for n in report.not_collected)
    assert report.kernels == []
    assert "no kernel profiled" in render_profile_section(report)


def test_rendered_h200_spill_kernel() -> None:
    keep = [m.name for m in CURATED_METRICS]
    launches = first_launch_per_kernel(
        parse_ncu_raw_csv((DATA / "ncu_raw.csv").read_text(), keep=keep)
    )
    sass = summarize_sass((DATA / "sass.txt").read_text())
    ptxas = ptxas_by_function(parse_ptxas_output((DATA / "run.log").read_text()))
    name = "spill_kernel(const float *, float *, const int *, int)"
    report = ProfileReport(
        arch="sm_90",
        kernels=[
            KernelProfile(
                name=name,
                metrics=launches[name],
                sass=sass["_Z12spill_kernelPKfPfPKii"],
                ptxas=ptxas["_Z12spill_kernelPKfPfPKii"],
            )
        ],
        timeline=summarize_events(
            [
                {"ph": "X", "cat": "kernel", "name": "spill_kernel", "ts": 0.0, "dur": 199.0},
                {"ph": "X", "cat": "kernel", "name": "spill_kernel", "ts": 260.0, "dur": 199.0},
            ]
        ),
        not_collected=[
            NotCollected("ncu-metrics", "2 metrics this chip or ncu lacks were dropped")
        ],
        wall_s=12.5,
    )
    text = render_profile_section(report)
    lines = text.splitlines()
    assert lines[0] == "profile (sm_90, 12.5 s)"
    assert "  sol: Duration 199 us" in text
    assert "Local load sectors 63,476,927" in text
    assert "Registers per thread 20" in text
    assert "stalls (% of warp cycles): long_scoreboard 66.3%" in text
    assert "  sass: 104 inst; LOCAL 2 MUFU 2; LDG 32b x2; STG 32b x1" in lines
    assert "  ptxas (sm_90a): 20 regs, smem 0 B, stack 256 B, spill st/ld 0/0 B" in lines
    assert "timeline (kineto): 2 kernels" in text
    assert "1 gaps > 5.0 us" in text
    assert "not collected: ncu-metrics: 2 metrics" in text


def test_derived_metrics_of_real_kernels() -> None:
    launches = first_launch_per_kernel(parse_ncu_raw_csv((DATA / "ncu_raw.csv").read_text()))
    naive = derived_metrics(launches["naive_softmax_kernel(const float *, float *, int, int)"])
    assert naive["sectors/request (ld)"] == 32.0
    matmul = derived_metrics(
        launches["naive_matmul_kernel(const float *, const float *, float *, int)"]
    )
    # 2048^3 FMAs = 2 * 2048^3 FLOP on the FP32 pipes (no FADD/FMUL in the inner loop)
    assert matmul["FP32 FLOP"] == pytest.approx(2 * 2048**3, rel=1e-3)


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (198560, "ns", "199 us"),
        (3179744, "ns", "3.18 ms"),
        (512, "ns", "512 ns"),
        (90042112, "byte", "90 MB"),
        (512, "byte/block", "512 B"),
        (6.2399, "%", "6.2%"),
        (63476927, "sector", "63,476,927"),
        (1.45, "warp", "1.45"),
    ],
)
def test_format_value(value: float, unit: str, text: str) -> None:
    assert format_value(value, unit) == text


FAKE_NCU = r"""
import json
# the target command is the last four arguments: python -m <target module> <spec.json>
spec = json.load(open(argv[-1]))
assert spec["mode"] == "ncu" and spec["qualname"] == "double", spec
regex = argv[argv.index("-k") + 1]
open(OUT, "w").write(json.dumps({"argv": argv, "spec": spec}))
text = open(CSV).read()
# ncu prints the kernel by its mangled name under --print-kernel-base mangled
print(text.replace("spill_kernel(const float *, float *, const int *, int)", "_Z12scale_kernelPffi"))
"""


def test_gpu_path_with_a_fake_ncu(
    built_extension, tool_or_skip, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Everything real except the GPU check and ncu itself: the timeline child runs (and,
    without a GPU, fails with its reason), the selection, the ncu command, the join."""
    tool_or_skip("cuobjdump")
    tool_or_skip("nvdisasm")
    import sys

    problem = tmp_path / "test_double.py"
    problem.write_text(
        "import pytest, torch\n"
        "def inputs(device):\n    return (torch.ones(4, device=device),)\n"
        "@pytest.mark.kernelpro(reference=lambda x: x * 2, inputs=inputs)\n"
        "def double(x):\n    return x * 2\n",
        encoding="utf-8",
    )
    record = tmp_path / "ncu_call.json"
    ncu = tmp_path / "ncu"
    ncu.write_text(
        f"#!{sys.executable}\nimport sys\nargv = sys.argv[1:]\n"
        f"OUT = {str(record)!r}\nCSV = {str(DATA / 'ncu_raw.csv')!r}\n" + FAKE_NCU,
        encoding="utf-8",
    )
    ncu.chmod(0o755)
    monkeypatch.setattr("pytest_kernelpro.profile.collect._gpu_problem", lambda device: None)
    monkeypatch.setattr("pytest_kernelpro.profile.collect.nsys_status", lambda: "not here")
    # The timeline child sees no GPU on any host: on a real one its trace names the kernel
    # that ran (x * 2's vectorized_elementwise_kernel), and the selection rightly follows it
    # instead of the captured module's entry point this test is about.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    class ProblemLocator:
        path = str(problem)
        qualname = "double"
        shape_index = None

    (build,) = built_extension.capture.builds
    report = profile_kernel_item(
        ProblemLocator(),
        so_paths=[build.so_path],
        device="cuda",
        timeout_s=120,
        ncu_path=str(ncu),
        ptxas=build.ptxas,
    )
    call = json.loads(record.read_text())
    argv = call["argv"]
    assert argv[argv.index("-k") + 1] == "regex:^(_Z12scale_kernelPffi)$"
    assert argv[argv.index("--nvtx-include") + 1] == "kernelpro/"
    assert argv[argv.index("--launch-count") + 1] == "32"
    assert call["spec"]["extra_cuda_cflags"] == ["-lineinfo", "-Xptxas=-v"]
    own = report.kernels[0]
    assert own.name.startswith("scale_kernel(")
    assert own.metrics is not None
    assert own.metrics.kernel_name == "_Z12scale_kernelPffi"
    assert own.metrics.get("l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum") == 63_476_927
    assert own.sass is not None
    assert own.ptxas is not None
    assert report.arch == "sm_90"
    # the fixture's other launches are still reported, after the item's own kernel
    assert len(report.kernels) > 1
    timeline = next(n for n in report.not_collected if n.what == "timeline")
    assert "kineto run failed" in timeline.why or "no CUDA device" in timeline.why
