"""The GPU memory one evaluation takes at its peak, seen from the session.

The watchdog's peaks (`supervise._watch`) count each process's resident host pages; what a
CUDA problem's worker and judge hold on the GPU is not among them. So while a CUDA problem's
evaluation runs, the session samples the device's used memory (total - free, the driver's
count: every context and every caching allocator's reserve) and reports the largest use above
the level at the evaluation's start (`device_peak_mb`, beside the footprint's
`device_estimate_bytes`), and where the processes were at that peak (`device_peak_at`: the
worker's last reported phase, the judge's host memory).

The count is the device's, not the evaluation's own: anything else that allocates on the GPU
meanwhile (another worker, another program) is in it, so it errs high. It is reported, never
a limit: a process that passes the GPU's memory fails in its allocator, which the evaluation
reports as that candidate's error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

INTERVAL_S = 0.01  # a phase that holds a copy of a large output lasts far longer


class DevicePeak:
    """Samples `used_bytes()` on a thread of its own from construction until `stop()`;
    `where()` is read at each new peak (`at`)."""

    def __init__(
        self,
        used_bytes: Callable[[], int],
        where: Callable[[], Any] = lambda: None,
        interval_s: float = INTERVAL_S,
    ) -> None:
        self._used_bytes = used_bytes
        self._where = where
        self._interval_s = interval_s
        self.base = used_bytes()
        self.peak = self.base
        self.at: Any = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="kernelpro-device-peak")
        self._thread.daemon = True
        self._thread.start()

    def _sample(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self._take()

    def _take(self) -> None:
        used = self._used_bytes()
        if used > self.peak:
            self.peak, self.at = used, self._where()

    def stop(self) -> int:
        """Bytes above the level at the start, at the largest sample (one taken at the first
        stop included); a second stop changes nothing."""
        if not self._stopped.is_set():
            self._stopped.set()
            self._thread.join()
            self._take()
        return self.peak - self.base


def cuda_used_bytes(device: str) -> Callable[[], int]:
    """The used memory of `device`'s GPU (total - free), as the driver counts it."""
    import torch

    index = torch.device(device)

    def used() -> int:
        free, total = torch.cuda.mem_get_info(index)
        return int(total - free)

    return used
