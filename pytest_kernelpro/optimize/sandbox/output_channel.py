"""How a worker's checked outputs reach the judge: raw tensor bytes in memory-mapped files,
written straight from the device and read by the judge without unpickling anything.

The worker ran candidate code, so the judge (`judge.py`) recomputes the reference and
compares the candidate's outputs in a process the candidate never ran in. Those outputs must
cross from one process to the other. They used to cross as `torch.save` pickles of CPU
copies: a device-to-host copy, a second copy on the host, a pickle written to the scratch
disk, then read back and unpickled; for a 6.4 GB output (KernelBench level 1 `23_Softmax`)
times five checked calls that took longer than the run timeout. Here each output is:

- `NAME.json`, a manifest: one entry per leaf of the output (`checks.flatten`), a tensor as
  dtype, shape and the file holding its bytes, a number as its value;
- `NAME.K.bin` per tensor leaf: its elements, contiguous, in its dtype. The worker maps the
  file (`torch.from_file(shared=True)`) and copies the device tensor into it: one copy,
  device to the file's pages, and no temporary host tensor.

The judge validates the manifest (known dtypes, whole non-negative shapes, a file of exactly
the size the shape implies, no links, names inside the directory) and maps each file
privately (`torch.from_file(shared=False)`): nothing is unpickled, and a hostile manifest
can name no other file. The comparison then moves the candidate's tensor to the reference's
device (`measure.compare`) and compares it there in chunks, as the gate does, so the judge's
device memory is bounded by one output plus the comparison's chunked temporaries.

Why not CUDA IPC handles (the output never leaving the device): legacy CUDA IPC memory
handles cannot be opened across PID namespaces, and the worker and the judge each run in
their own (`isolation.py`); sharing one would let candidate code signal and inspect the
judge. What bounds this channel instead: the files live in the evaluation's scratch
directory, so an output must fit the free space of that file system (`check_room`, named in
the error), and the pages are written once and read once through the page cache.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

# dtype name in the manifest -> torch dtype attribute; anything else is refused.
DTYPES = (
    "float64", "float32", "float16", "bfloat16", "complex64", "complex128",
    "int64", "int32", "int16", "int8", "uint8", "bool",
)  # fmt: skip
MANIFEST_SUFFIX = ".json"
MAX_LEAVES = 4096  # leaves of one output a manifest may list


class OutputChannelError(Exception):
    """An output could not be handed over (too large for the channel, or a bad manifest)."""


def output_bytes(torch: Any, leaves: list[Any]) -> int:
    """Bytes the tensor leaves of one output take in the channel."""
    return sum(
        leaf.numel() * leaf.element_size() for leaf in leaves if isinstance(leaf, torch.Tensor)
    )


def check_room(directory: Path, needed: int) -> None:
    """Refuse an output the channel's file system cannot hold (free space, the limit on
    what size an evaluation handles), naming both numbers."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise OutputChannelError(
            f"the checked output takes {needed / 1e9:.2f} GB and the scratch file system of "
            f"{directory} has {free / 1e9:.2f} GB free; the judge cannot receive it. Point "
            "TMPDIR (the evaluations' scratch) at a file system with room for five outputs"
        )


def write_output(torch: Any, stem: Path, leaves: list[Any]) -> None:
    """Write one output's leaves as `stem.json` plus one `stem.K.bin` per tensor."""
    check_room(stem.parent, output_bytes(torch, leaves))
    entries: list[dict[str, Any]] = []
    for k, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            name = str(leaf.dtype).removeprefix("torch.")
            if name not in DTYPES:
                raise OutputChannelError(
                    f"output leaf {k} has dtype {leaf.dtype}, not one of {DTYPES}"
                )
            file = stem.with_name(f"{stem.name}.{k}.bin")
            numel = leaf.numel()
            if numel:
                # The file's pages are the destination: one copy from the device.
                target = torch.from_file(str(file), shared=True, size=numel, dtype=leaf.dtype)
                target.copy_(leaf.detach().reshape(-1))
                del target
            else:
                file.write_bytes(b"")
            entries.append(
                {"kind": "tensor", "dtype": name, "shape": list(leaf.shape), "file": file.name}
            )
        elif isinstance(leaf, (bool, int, float)) or leaf is None:
            entries.append({"kind": "value", "value": leaf})
        else:
            entries.append({"kind": "value", "value": repr(leaf)[:200]})
    manifest = stem.with_name(stem.name + MANIFEST_SUFFIX)
    tmp = manifest.with_name(manifest.name + ".tmp")
    tmp.write_text(json.dumps(entries), encoding="utf-8")
    os.replace(tmp, manifest)  # the manifest last: a reader never sees half an output


def read_output(torch: Any, stem: Path) -> list[Any]:
    """The leaves `write_output` wrote under `stem`, tensors mapped from their files (CPU)."""
    manifest = stem.with_name(stem.name + MANIFEST_SUFFIX)
    if manifest.is_symlink() or not manifest.is_file():
        raise FileNotFoundError(f"no output {stem.name}")
    entries = json.loads(manifest.read_text(encoding="utf-8"))
    if not isinstance(entries, list) or len(entries) > MAX_LEAVES:
        raise OutputChannelError(f"{manifest.name}: not a list of at most {MAX_LEAVES} leaves")
    leaves: list[Any] = []
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise OutputChannelError(f"{manifest.name}: leaf {k} is not an object")
        if entry.get("kind") == "value":
            value = entry.get("value")
            if not (value is None or isinstance(value, (bool, int, float, str))):
                raise OutputChannelError(f"{manifest.name}: leaf {k} is not a plain value")
            leaves.append(value)
            continue
        leaves.append(_mapped_tensor(torch, stem, manifest.name, k, entry))
    return leaves


def _mapped_tensor(torch: Any, stem: Path, where: str, k: int, entry: dict[str, Any]) -> Any:
    dtype_name, shape, file = entry.get("dtype"), entry.get("shape"), entry.get("file")
    if entry.get("kind") != "tensor" or dtype_name not in DTYPES:
        raise OutputChannelError(
            f"{where}: leaf {k} has kind/dtype {entry.get('kind')}/{dtype_name}"
        )
    if not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise OutputChannelError(f"{where}: leaf {k} has shape {shape!r}")
    expected_name = f"{stem.name}.{k}.bin"
    if file != expected_name:  # no other file of the file system can be named
        raise OutputChannelError(f"{where}: leaf {k} names file {file!r}, not {expected_name}")
    path = stem.with_name(expected_name)
    if path.is_symlink() or not path.is_file():
        raise OutputChannelError(f"{where}: leaf {k}'s file {expected_name} is missing")
    dtype = getattr(torch, dtype_name)
    numel = 1
    for n in shape:
        numel *= n
    itemsize = torch.empty((), dtype=dtype).element_size()
    size = path.stat().st_size
    if size != numel * itemsize:
        raise OutputChannelError(
            f"{where}: leaf {k}'s file holds {size} bytes, its shape {shape} needs {numel * itemsize}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    # A private mapping: the judge reads the pages and never writes the file.
    return torch.from_file(str(path), shared=False, size=numel, dtype=dtype).view(shape)
