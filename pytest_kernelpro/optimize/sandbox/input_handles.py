"""A checked call's inputs by handle: made once by the problem's input maker in the worker,
on its device, then shared read-only by the reference and the candidate instead of a copy
for each.

Each contiguous CPU tensor input is copied once into a sealed memfd (`handles._sealed_copy`:
anonymous shared memory, sealed against writing, growing and shrinking) and mapped back
read-only and shared (`PROT_READ`, `MAP_SHARED`); the tensor the maker returned is dropped.
What that guarantees:

- nobody changes a checked call's inputs: a write through the mapping faults (the worker
  dies with SIGSEGV, classified as a write to its read-only inputs), and the mapping cannot
  be made writable (`mprotect` is refused on a shared mapping of a write-sealed memfd), so
  the reference's and the candidate's calls see the same bytes without a copy each, and the
  "modifies its inputs in place" check needs no copy to compare with;
- nothing outlives the call: the memfd has no name in any file system (no /dev/shm entry)
  and its descriptor closes with `close()` (or with the worker's PID namespace when it is
  killed); the mapping goes with the last tensor that views it.

A reference that writes into its own inputs (found on its first call, on a copy) gets
writable copies (`writable`), and the candidate with it: a kernel may do what the problem
does. A plain tensor that cannot be sealed (a CUDA tensor: device memory, no host pages to
seal; a view with strides) is handed to a call that must not write as it is, its digest
(`checks.digest`: a fingerprint made on a GPU, SHA-256 of the bytes on the CPU) taken when
it is handed over and compared after the call (`modified`): a copy per call would be one
input set more at the worker's peak, beside the judge's copies on the same GPU
(bench/results/2026-12-06-device-calls6.md). What is neither (tensors that require grad,
subclasses, tensors inside lists, non-tensor values) is kept as the maker made it and copied
for each call (`clone_inputs`). Like every check in the worker, the digest's is a claim made
where the candidate runs. Inputs do not cross processes: the judge makes its own from the
same seeds in a process the candidate never ran in, so no input the candidate's process made
is trusted.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import warnings
from collections.abc import Sequence
from typing import Any

from pytest_kernelpro.measure.correctness_check import clone_inputs
from pytest_kernelpro.optimize.sandbox.handles import DTYPES, _sealed_copy


class SealedInputs:
    """One input set: `values` for every call that must not write (read-only where sealed),
    `writable()` for one that may; `close()` frees the handles' descriptors."""

    def __init__(self, torch: Any, values: Sequence[Any], label: str = "inputs") -> None:
        self.torch = torch
        self._fds: list[int] = []
        self._sealed_at: set[int] = set()
        # Handed as they are to a call that must not write: position -> digest when handed.
        self._shared_at = {k for k, value in enumerate(values) if _shareable(torch, value)}
        self._digests: dict[int, bytes] = {}
        self.sealed_bytes = 0
        sealed: list[Any] = []
        try:
            for k, value in enumerate(values):
                if _sealable(torch, value):
                    fd = _sealed_copy(torch, f"kernelpro-{label}-{k}", value)
                    self._fds.append(fd)
                    sealed.append(_read_only(torch, fd, value))
                    self._sealed_at.add(k)
                    self.sealed_bytes += value.numel() * value.element_size()
                else:
                    sealed.append(value)
        except BaseException:
            self.close()
            raise
        self.values = sealed

    def writable(self) -> list[Any]:
        """A copy of every input, for a call that may write into its inputs."""
        return clone_inputs(self.torch, self.values)

    def read_only(self) -> list[Any]:
        """The inputs of a call that must not write: the sealed ones themselves (a write
        faults), the shared ones themselves with their digests taken now, a copy of every
        other; `modified` says whether the call changed any."""
        from pytest_kernelpro.optimize.sandbox.checks import digest

        self._digests = {k: digest(self.values[k]) for k in sorted(self._shared_at)}
        return [
            value
            if k in self._sealed_at or k in self._shared_at
            else clone_inputs(self.torch, value)
            for k, value in enumerate(self.values)
        ]

    def modified(self, given: Sequence[Any]) -> bool:
        """Whether the call given `read_only()`'s inputs changed one: a shared input by its
        digest, a copied one against the value it copies (a sealed one cannot change)."""
        from pytest_kernelpro.optimize.sandbox.checks import digest, same_values

        for k, value in enumerate(self.values):
            if k in self._digests:
                if digest(given[k]) != self._digests[k]:
                    return True
            elif (
                k not in self._sealed_at
                and _holds_tensor(self.torch, value)
                and not same_values(given[k], value)
            ):
                return True
        return False

    def close(self) -> None:
        """Close the descriptors (mappings still held keep their pages until dropped)."""
        while self._fds:
            with contextlib.suppress(OSError):
                os.close(self._fds.pop())


def _holds_tensor(torch: Any, value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(torch, v) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensor(torch, v) for v in value.values())
    return False


def _plain(torch: Any, value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor) and type(value) is torch.Tensor and not value.requires_grad
    )


def _sealable(torch: Any, value: Any) -> bool:
    return (
        _plain(torch, value)
        and value.device.type == "cpu"
        and value.numel() > 0
        and value.is_contiguous()
        and str(value.dtype).removeprefix("torch.") in DTYPES
    )


def _shareable(torch: Any, value: Any) -> bool:
    return _plain(torch, value) and not _sealable(torch, value)


def _read_only(torch: Any, fd: int, like: Any) -> Any:
    """A tensor of `like`'s shape and dtype over a read-only shared mapping of `fd`."""
    nbytes = like.numel() * like.element_size()
    pages = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    with warnings.catch_warnings():
        # torch warns that the buffer is not writable: that is the point.
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        flat = torch.frombuffer(pages, dtype=like.dtype)  # keeps `pages` alive
    return flat.view(like.shape)
