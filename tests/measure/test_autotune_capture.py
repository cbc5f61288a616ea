"""Recording autotune choices and pinning the baseline's (measure/autotune_capture.py), on the
stand-in autotuner (Triton 3.6's attribute names and key rule) and, where Triton is installed,
on Triton's own `Autotuner` through its interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import standin_autotuner as sa
import torch

from pytest_kernelpro.measure.autotune_capture import (
    CACHED,
    PINNED,
    SINGLE,
    TUNED,
    TUNED_IN_TIMING,
    AutotuneCapture,
    Pin,
    autotune_key,
    config_words,
)
from pytest_kernelpro.measure.environment import library_choices

LAST: dict[str, int] = {}
BENCHED: list[int] = []


def _bench(kernel_call, quantiles):  # noqa: ANN001, ANN202
    """The autotuner's timing of a config: num_warps=8 is the fastest here."""
    kernel_call()
    BENCHED.append(LAST["num_warps"])
    return [1.0 if LAST["num_warps"] == 8 else 2.0] * 3


def _make_kernel() -> sa.Autotuner:
    @sa.autotune(
        configs=[sa.Config({"BLOCK": 64}, num_warps=4), sa.Config({"BLOCK": 128}, num_warps=8)],
        key=["n"],
        do_bench=_bench,
    )
    @sa.jit
    def scale(x, out, n, BLOCK, num_warps):  # noqa: ANN001, ANN202, N803
        LAST["num_warps"] = num_warps
        out.copy_(x * 2)

    return scale


WARPS_8 = {"BLOCK": 128, "num_warps": 8, "num_ctas": 1, "num_stages": 3}
WARPS_4 = {"BLOCK": 64, "num_warps": 4, "num_ctas": 1, "num_stages": 3}
NAME = f"{__name__}._make_kernel.<locals>.scale"


@pytest.fixture(autouse=True)
def _fresh_bench_log() -> None:
    BENCHED.clear()


def test_the_choice_is_the_key_and_the_flat_config_the_autotuner_kept() -> None:
    kernel = _make_kernel()
    x, out = torch.ones(16), torch.empty(16)
    capture = AutotuneCapture(classes=[sa.Autotuner])
    with capture.watching():
        kernel[(1,)](x, out, 16)
        kernel[(1,)](x, out, 16)  # the same key: from the cache, recorded once
    (choice,) = capture.part(None).choices
    assert choice == {
        "kernel": NAME,
        "key": [16, "torch.float32", "torch.float32"],
        "key_names": ["n"],
        "config": WARPS_8,
        "configs": 2,
        "source": TUNED,
    }
    assert list(kernel.cache) == [autotune_key(kernel, (x, out, 16), {})]
    assert kernel.cache[(16, "torch.float32", "torch.float32")] is kernel.best_config


def test_a_key_tuned_before_the_capture_is_recorded_as_cached() -> None:
    kernel = _make_kernel()
    x, out = torch.ones(16), torch.empty(16)
    kernel[(1,)](x, out, 16)
    capture = AutotuneCapture(classes=[sa.Autotuner])
    with capture.watching():
        kernel[(1,)](x, out, 16)
    assert capture.part(None).choices[0]["source"] == CACHED


def test_the_wrapper_is_gone_after_the_capture() -> None:
    original = sa.Autotuner.__dict__["run"]
    with AutotuneCapture(classes=[sa.Autotuner]).watching():
        assert sa.Autotuner.__dict__["run"] is not original
    assert sa.Autotuner.__dict__["run"] is original


def test_a_key_first_tuned_during_the_timing_is_recorded_from_the_cache() -> None:
    kernel = _make_kernel()
    capture = AutotuneCapture(classes=[sa.Autotuner])
    with capture.watching():
        kernel[(1,)](torch.ones(16), torch.empty(16), 16)
    kernel[(1,)](torch.ones(32, dtype=torch.float64), torch.empty(32, dtype=torch.float64), 32)
    capture.after_timing()
    second = capture.part(None).choices[1]
    assert second["key"] == [32, "torch.float64", "torch.float64"]
    assert second["source"] == TUNED_IN_TIMING


def test_a_single_config_kernel_is_recorded_without_a_key() -> None:
    @sa.autotune(configs=[sa.Config({"BLOCK": 32}, num_warps=2)], key=["n"])
    @sa.jit
    def one(x, out, n, BLOCK, num_warps):  # noqa: ANN001, ANN202, N803
        out.copy_(x)

    capture = AutotuneCapture(classes=[sa.Autotuner])
    with capture.watching():
        one[(1,)](torch.ones(4), torch.empty(4), 4)
    (choice,) = capture.part(None).choices
    assert choice["source"] == SINGLE
    assert choice["key"] is None
    assert choice["config"]["BLOCK"] == 32


def test_a_pin_runs_the_baselines_config_without_tuning_and_stays_in_the_cache() -> None:
    """The attack: the autotuner would pick num_warps=8 here; the pin must win, and later
    calls outside the capture (the timing) must keep it."""
    kernel = _make_kernel()
    x, out = torch.ones(16), torch.empty(16)
    pin = Pin(kernel=NAME, key=[16, "torch.float32", "torch.float32"], config=WARPS_4)
    capture = AutotuneCapture(pins=[pin], classes=[sa.Autotuner])
    with capture.watching():
        kernel[(1,)](x, out, 16)
    assert BENCHED == []  # no config was timed: nothing was tuned
    kernel[(1,)](x, out, 16)
    assert LAST["num_warps"] == 4
    data = capture.part(None)
    assert data.choices[0]["source"] == PINNED
    assert data.choices[0]["config"] == WARPS_4
    assert data.pinned[0]["config"] == WARPS_4


def test_a_pin_for_another_key_leaves_the_autotuner_alone() -> None:
    kernel = _make_kernel()
    pin = Pin(kernel=NAME, key=[999, "torch.float32", "torch.float32"], config=WARPS_4)
    capture = AutotuneCapture(pins=[pin], classes=[sa.Autotuner])
    with capture.watching():
        kernel[(1,)](torch.ones(16), torch.empty(16), 16)
    assert sorted(BENCHED) == [4, 8]
    assert capture.part(None).choices[0]["config"] == WARPS_8


def test_a_pin_of_a_config_the_kernel_does_not_have_is_refused_with_the_reason() -> None:
    kernel = _make_kernel()
    gone = {**WARPS_4, "BLOCK": 256}
    capture = AutotuneCapture(
        pins=[Pin(kernel=NAME, key=None, config=gone)], classes=[sa.Autotuner]
    )
    with capture.watching():
        kernel[(1,)](torch.ones(16), torch.empty(16), 16)
    data = capture.part(None)
    assert data.choices[0]["source"] == TUNED
    (problem,) = data.pin_problems
    assert "scale: the baseline's config BLOCK=256, num_warps=4" in problem
    assert "is not among the kernel's configs now" in problem


def test_config_words_and_library_settings() -> None:
    assert config_words(WARPS_8) == "BLOCK=128, num_warps=8, num_ctas=1, num_stages=3"
    library = library_choices()
    assert library["cudnn.benchmark"] is torch.backends.cudnn.benchmark
    assert library["float32_matmul_precision"] == torch.get_float32_matmul_precision()


def test_a_changed_cudnn_benchmark_setting_is_read() -> None:
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = not before  # set and restored by hand (a backend flag)
    try:
        assert library_choices()["cudnn.benchmark"] is (not before)
    finally:
        torch.backends.cudnn.benchmark = before


TRITON_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, triton, triton.language as tl
    from pytest_kernelpro.measure.autotune_capture import AutotuneCapture, Pin

    def host_bench(call, quantiles):
        call()
        return [1.0, 1.0, 1.0]  # every config ties: Triton keeps the first

    @triton.autotune(
        configs=[triton.Config({"BLOCK": 16}, num_warps=4), triton.Config({"BLOCK": 32}, num_warps=8)],
        key=["n"], do_bench=host_bench)
    @triton.jit
    def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    x = torch.arange(100, dtype=torch.float32)
    out = torch.empty_like(x)
    grid = lambda meta: (triton.cdiv(100, meta["BLOCK"]),)
    pins = [Pin(kernel="__main__.scale", key=None, config=json.loads(sys.argv[1]))] if len(sys.argv) > 1 else []
    capture = AutotuneCapture(pins=pins)
    with capture.watching():
        scale[grid](x, out, 100)
    assert torch.equal(out, x * 2)
    print(json.dumps({"choices": list(capture.part(None).choices)}))
    """
)


def test_triton_interpreter_records_and_pins_through_tritons_own_autotuner(
    tmp_path: Path,
) -> None:
    """Triton 3.6's `Autotuner` itself, run by its interpreter on the CPU: the choice is read
    from its cache, and a pin replaces the pick it would make (the first config on a tie)."""
    pytest.importorskip("triton")
    import json

    script = tmp_path / "run_triton.py"
    script.write_text(TRITON_SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="1")

    def run(*args: str) -> dict:
        proc = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True,
                              text=True, timeout=300, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    (tuned,) = run()["choices"]
    assert tuned["config"] == {"BLOCK": 16, "num_warps": 4, "num_ctas": 1, "num_stages": 3}
    assert tuned["key"] == [100, "torch.float32", "torch.float32"]
    assert tuned["source"] == TUNED
    wanted = {"BLOCK": 32, "num_warps": 8, "num_ctas": 1, "num_stages": 3}
    (pinned,) = run(json.dumps(wanted))["choices"]
    assert pinned["config"] == wanted
    assert pinned["source"] == PINNED


def test_a_pins_file_that_is_not_a_list_of_choices_is_refused_naming_it(tmp_path: Path) -> None:
    """A re-measuring child's pins file (written by its parent) read back: the choices as
    `Pin`s; a missing, broken or mis-shaped file is an error naming the file."""
    from pytest_kernelpro.errors import KernelproError
    from pytest_kernelpro.measure.autotune_capture import Pin, read_pins

    good = tmp_path / "pins.json"
    good.write_text('[{"kernel": "m.k", "key": [1024, "torch.float32"], "config": {"B": 64}}]')
    assert read_pins(good) == [Pin("m.k", [1024, "torch.float32"], {"B": 64})]
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(KernelproError, match=r"cannot read the autotune pins .*broken\.json"):
        read_pins(broken)
    with pytest.raises(KernelproError, match=r"cannot read the autotune pins .*absent\.json"):
        read_pins(tmp_path / "absent.json")
    shaped = tmp_path / "shaped.json"
    shaped.write_text('{"kernel": "m.k"}')
    with pytest.raises(KernelproError, match=r"shaped\.json are not a JSON list of choices"):
        read_pins(shaped)
