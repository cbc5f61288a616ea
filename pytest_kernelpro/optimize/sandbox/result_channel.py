"""The result file of a sandboxed child (`ResultChannel`): opened before untrusted code runs,
written once with the JSON encoder and `os` functions this module kept at import, so a
candidate that rebinds `json.dumps` or `os.write` cannot change what the child writes.

Imported by the worker and the re-measurement child before any candidate module, as
`measure/bound.py` is; its namespace is kept by `bound.keep_module`, so a candidate that
rebinds one of its names is named by `bound.tampered`. Standard library only at import.
"""

from __future__ import annotations

import json.encoder
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_kernelpro.measure import bound

_os_open, _os_write, _os_fsync = os.open, os.write, os.fsync
_os_close, _os_replace = os.close, os.replace
# The C JSON encoder, kept now: its floats are written by `float.__repr__`.
_C_MAKE_ENCODER = getattr(json.encoder, "c_make_encoder", None)
_ENCODE_STRING = json.encoder.encode_basestring_ascii


def _reject_default(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode_json(value: Any) -> str:
    """`value` as compact JSON by the encoder kept at import."""
    if _C_MAKE_ENCODER is None:
        return bound.json_dumps(value, allow_nan=True)
    encoder = _C_MAKE_ENCODER(
        None, _reject_default, _ENCODE_STRING, None, ":", ",", False, False, True
    )
    return "".join(encoder(value, 0))


@dataclass
class ResultChannel:
    """A result file opened before untrusted code runs, written once with the kept encoder
    and `os` functions as `<path>.part`, renamed over `path` when complete."""

    path: str
    _fd: int = -1
    _encode: Callable[[Any], str] = encode_json

    def __post_init__(self) -> None:
        self._encode = encode_json  # kept now: rebinding the module's name later changes nothing
        self._fd = _os_open(self.path + ".part", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def write(self, value: Any) -> None:
        data = self._encode(value).encode("utf-8")
        view = memoryview(data)
        while view:
            written = _os_write(self._fd, view)
            view = view[written:]
        _os_fsync(self._fd)
        _os_close(self._fd)
        self._fd = -1
        _os_replace(self.path + ".part", self.path)


bound.keep_module(sys.modules[__name__])
