"""A checked call's inputs by handle (`optimize/sandbox/input_handles.py`): sealed once,
read-only for every call that must not write, nothing left after `close()`, and the ways a
kernel could try to write them anyway, each refused.

Plain unit tests; the writes that fault run in a child process (a fault kills it). The real
path (a sandboxed worker whose candidate writes its inputs) is test_input_handle_sandbox.py.
"""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import textwrap

import pytest
from test_handles import memfds, shm_entries

from pytest_kernelpro.optimize.sandbox.input_handles import SealedInputs

torch = pytest.importorskip("torch")

# A child that seals one input, then runs ATTACK with `x` (the read-only input) and `fd`
# (its memfd's descriptor) in scope; it prints UNCHANGED when the sealed bytes are intact.
CHILD = """
import os, sys, torch
from pytest_kernelpro.optimize.sandbox.input_handles import SealedInputs
inputs = SealedInputs(torch, [torch.arange(1024, dtype=torch.float32)])
x = inputs.values[0]
fd = next(
    int(n) for n in os.listdir("/proc/self/fd")
    if os.readlink(f"/proc/self/fd/{n}").startswith("/memfd:kernelpro-inputs")
)
ATTACK
print("UNCHANGED" if torch.equal(x, torch.arange(1024, dtype=torch.float32)) else "CHANGED")
"""


def run_child(attack: str) -> subprocess.CompletedProcess[str]:
    code = CHILD.replace("ATTACK", textwrap.dedent(attack))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_sealed_inputs_hold_the_makers_values_without_a_copy_per_call() -> None:
    made = [torch.randn(8, 16), torch.arange(5), 3, "tag"]
    expected = [t.clone() if isinstance(t, torch.Tensor) else t for t in made]
    inputs = SealedInputs(torch, made)
    try:
        assert inputs.sealed_bytes == 8 * 16 * 4 + 5 * 8
        views = inputs.read_only()
        assert not inputs.modified(views)
        for got, want in zip(views, expected, strict=True):
            if isinstance(want, torch.Tensor):
                assert torch.equal(got, want)
                assert got.dtype == want.dtype
            else:
                assert got == want
        # The same pages for every call: no copy per call.
        assert views[0].data_ptr() == inputs.values[0].data_ptr()
        assert inputs.read_only()[0].data_ptr() == views[0].data_ptr()
        # A call that may write gets copies.
        writable = inputs.writable()
        assert writable[0].data_ptr() != views[0].data_ptr()
        writable[0].add_(1)
        assert torch.equal(inputs.values[0], expected[0])
    finally:
        inputs.close()


def test_a_plain_tensor_that_cannot_be_sealed_is_shared_and_its_writes_seen() -> None:
    """A strided CPU tensor is the CPU stand-in of a CUDA input: handed to the call as it is
    (no copy), its digest taken when handed and compared after the call."""
    strided = torch.randn(16, 8).t()  # not contiguous: its strides are the problem's
    inputs = SealedInputs(torch, [strided, torch.randn(8)])
    try:
        assert inputs.sealed_bytes == 8 * 4
        views = inputs.read_only()
        assert views[0].data_ptr() == strided.data_ptr()
        assert views[0].stride() == strided.stride()
        assert not inputs.modified(views)
        original = views[0][3, 5].item()
        views[0][3, 5] = original + 1.0  # one element of 128
        assert inputs.modified(views)
        views[0][3, 5] = original  # put back: the same bytes again
        assert not inputs.modified(views)
        views[0].mul_(-1.0)  # a sign flip: the same values up to sign, other bytes
        assert inputs.modified(views)
    finally:
        inputs.close()


def test_what_is_neither_sealed_nor_shared_is_copied_for_each_call() -> None:
    grad = torch.randn(4, requires_grad=True)
    nested = [torch.randn(3)]
    inputs = SealedInputs(torch, [grad, nested])
    try:
        assert inputs.sealed_bytes == 0
        views = inputs.read_only()
        assert views[0].data_ptr() != grad.data_ptr()
        assert views[1][0].data_ptr() != nested[0].data_ptr()
        assert not inputs.modified(views)
        with torch.no_grad():
            views[1][0].add_(1.0)
        assert inputs.modified(views)
    finally:
        inputs.close()


def test_nothing_is_left_once_closed_and_its_calls_are_done() -> None:
    before_fds, before_shm = memfds(), shm_entries()
    inputs = SealedInputs(torch, [torch.randn(256, 256), torch.randn(64)])
    assert len(memfds()) > len(before_fds)
    views = inputs.read_only()
    inputs.close()
    # A mapping still held keeps its pages readable until it is dropped.
    assert views[0].shape == (256, 256)
    float(views[0].sum())
    del views, inputs
    gc.collect()
    assert memfds() == before_fds
    assert shm_entries() == before_shm  # the handles never had a name


@pytest.mark.slow
def test_a_write_into_a_sealed_input_faults() -> None:
    run = run_child("x.add_(1)")
    assert run.returncode == -signal.SIGSEGV, run.stderr[-2000:]
    assert "UNCHANGED" not in run.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("attack", "refused_with"),
    [
        # Make the mapping writable again.
        (
            """
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            page = x.data_ptr() & ~4095
            if libc.mprotect(ctypes.c_void_p(page), 4096, 3) != 0:
                print("REFUSED mprotect errno", ctypes.get_errno())
            else:
                x.add_(1)
            """,
            "REFUSED mprotect",
        ),
        # A writable shared mapping of the same memfd.
        (
            """
            import mmap
            try:
                mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            except PermissionError as exc:
                print("REFUSED mmap", exc)
            """,
            "REFUSED mmap",
        ),
        # The memfd reopened through /proc for writing, then written.
        (
            """
            again = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
            try:
                os.pwrite(again, b"\\xff" * 64, 0)
            except PermissionError as exc:
                print("REFUSED write", exc)
            """,
            "REFUSED write",
        ),
        # Shrunk to nothing and grown back (new zero pages).
        (
            """
            try:
                os.ftruncate(fd, 0)
            except PermissionError as exc:
                print("REFUSED truncate", exc)
            """,
            "REFUSED truncate",
        ),
        # torch's own shared mapping of the file, written.
        (
            """
            try:
                torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=1024).add_(1)
            except RuntimeError as exc:
                print("REFUSED from_file", exc)
            """,
            "REFUSED from_file",
        ),
    ],
    ids=["mprotect", "writable mmap", "reopen and write", "truncate", "torch from_file"],
)
def test_every_way_around_the_read_only_mapping_is_refused(attack: str, refused_with: str) -> None:
    run = run_child(attack)
    assert run.returncode == 0, run.stderr[-2000:]
    assert refused_with in run.stdout, run.stdout
    assert "UNCHANGED" in run.stdout


@pytest.mark.slow
def test_a_private_copy_on_write_mapping_changes_only_itself() -> None:
    """The one mapping a process may write: its own private copy, never the sealed pages."""
    run = run_child(
        """
        mine = torch.from_file(f"/proc/self/fd/{fd}", shared=False, size=1024)
        mine.add_(1)
        print("PRIVATE", float(mine[0]))
        """
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "PRIVATE 1.0" in run.stdout
    assert "UNCHANGED" in run.stdout


@pytest.mark.gpu
def test_cuda_inputs_stay_on_their_device_shared_and_their_writes_seen() -> None:
    """The device-agnostic path: a CUDA input is made where it runs and never sealed (device
    memory has no host pages to seal); a call that must not write gets it as it is and its
    writes are seen by its digest, as a strided CPU input's are (the CPU stand-in above)."""
    made = torch.randn(64, 32, device="cuda")
    inputs = SealedInputs(torch, [made, torch.randn(8)])
    try:
        assert inputs.sealed_bytes == 8 * 4
        view = inputs.read_only()[0]
        assert view.device == made.device
        assert view.data_ptr() == made.data_ptr()
        assert not inputs.modified([view, inputs.values[1]])
        view[7, 3] += 1.0
        assert inputs.modified([view, inputs.values[1]])
    finally:
        inputs.close()
