"""One GPU per pytest-xdist worker (run/workers.py): a worker past the last GPU is not refused
(its ordinary tests run as without the plugin) and says why it cannot time a kernel on a GPU."""

from __future__ import annotations

import pytest

from pytest_kernelpro.run.workers import WorkerGpu, assign_worker_gpu


def test_each_worker_within_the_gpus_is_pinned_to_its_own() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "3,5"}
    assert assign_worker_gpu("gw1", 2, env) == WorkerGpu(gpu="5")
    assert env["CUDA_VISIBLE_DEVICES"] == "5"


def test_a_worker_past_the_last_gpu_is_left_alone_and_says_why() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    pinned = assign_worker_gpu("gw3", 8, env)
    assert pinned.gpu is None
    assert env["CUDA_VISIBLE_DEVICES"] == "0"  # its ordinary tests see what they saw
    assert pinned.shared is not None
    assert "gw3 has no GPU of its own" in pinned.shared
    assert "pytest -n 8 started 8 workers for 1 visible GPU(s) (0)" in pinned.shared
    assert "-n 1 or fewer" in pinned.shared


def test_no_gpu_pins_nothing() -> None:
    env = {"CUDA_VISIBLE_DEVICES": ""}
    assert assign_worker_gpu("gw5", 8, env) == WorkerGpu()
    assert env == {"CUDA_VISIBLE_DEVICES": ""}


def test_a_malformed_worker_id_is_named() -> None:
    with pytest.raises(ValueError, match="unexpected xdist worker id 'w1'"):
        assign_worker_gpu("w1", 2, {"CUDA_VISIBLE_DEVICES": "0"})


def test_more_workers_than_gpus_runs_a_suite_without_kernels(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin installed on a one-GPU machine used to refuse `pytest -n 2` for any suite,
    kernels or not. Ordinary tests now run on every worker."""
    pytest.importorskip("xdist")
    pytester.makepyfile(
        test_plain="""
        import pytest

        @pytest.mark.parametrize("n", range(6))
        def test_plain(n):
            assert n >= 0
        """
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # one GPU, as far as the plugin can tell
    result = pytester.runpytest_subprocess("-n", "2")
    result.assert_outcomes(passed=6)
    assert "GPU(s) are visible" not in result.stdout.str() + result.stderr.str()
