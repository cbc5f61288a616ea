"""Load a cubin through the CUDA driver API and launch its kernels with torch tensors.

The driver calls go through `cuda-bindings` (NVIDIA's Python binding of the driver API,
`pip install cuda-bindings`, present with CUDA builds of torch >= 2.9). The module is loaded
into the device's primary context, the one the CUDA runtime (and so torch) uses, and each
launch goes to torch's current stream, so the kernels order with torch's own work, CUDA
graphs capture them, and timing with CUDA events sees them.

Arguments are packed into one parameter buffer per launch: a pointer parameter takes a
tensor's `data_ptr()` (or an int address), a scalar is converted to its declared C type, and
the buffer layout comes from the kernel image (`cuFuncGetParamInfo`), checked against the
parameter list parsed from the source.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.build.source import KernelSignature, Param, natural_layout

MAX_STATIC_SHARED = 48 * 1024  # dynamic shared memory above this needs an opt-in attribute


class LaunchError(KernelproError):
    """A kernel could not be loaded or launched (bad arguments, a driver error)."""


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python 12.x spelling
        except ImportError as exc:
            raise LaunchError(
                "running a fast-path kernel needs the CUDA driver binding: pip install "
                "cuda-bindings (or cuda-python)"
            ) from exc
    return driver


def _check(result: Any, what: str) -> Any:
    """The values of a cuda-bindings call after its CUresult; LaunchError on failure."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        label = name.decode() if isinstance(name, bytes) else str(err)
        detail = text.decode() if isinstance(text, bytes) else ""
        raise LaunchError(f"{what} failed: {label}: {detail}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def dims(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    """(x, y, z) of a grid or block given as an int or a 1 to 3-tuple of positive ints."""
    items = [value] if isinstance(value, int) else list(value)
    if not 1 <= len(items) <= 3 or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in items
    ):
        raise LaunchError(f"{what}={value!r} must be a positive int or a tuple of 1 to 3 of them")
    items += [1] * (3 - len(items))
    return items[0], items[1], items[2]


class CudaKernel:
    """One `extern "C"` kernel of a `CudaModule`; call it with its arguments and a launch
    spec: `kernel(x, y, n, grid=(blocks,), block=(256,), shared_mem=0)`."""

    def __init__(self, module: CudaModule, signature: KernelSignature) -> None:
        self.module = module
        self.signature = signature
        self.name = signature.name
        self._functions: dict[int, _Loaded] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<CudaKernel {self.signature.describe()} from {self.module.cubin_path}>"

    def pack(self, args: Sequence[Any]) -> bytes:
        """The parameter buffer for `args` under the natural layout (what the driver is
        given when no kernel image is loaded, e.g. to check packing without a GPU)."""
        params = self.signature.params
        if len(args) != len(params):
            raise LaunchError(
                f"kernel {self.signature.describe()} takes {len(params)} argument(s), "
                f"got {len(args)}"
            )
        layout = natural_layout(params)
        if layout is None:
            raise LaunchError(
                f"kernel {self.signature.describe()}: a parameter of a type this layer does "
                "not know; its size is read from the loaded kernel image"
            )
        offsets, total = layout
        return _struct(params, offsets, total).pack(*self._values(params, args))

    def _values(self, params: Sequence[Param], args: Sequence[Any]) -> list[Any]:
        values = []
        for index, (param, arg) in enumerate(zip(params, args, strict=True)):
            try:
                values.append(param.pack_value(arg))
            except TypeError as exc:
                label = param.name or f"#{index}"
                raise LaunchError(
                    f"argument {index} ({label}) of kernel {self.signature.describe()} {exc}"
                ) from None
        return values

    def _function(self, device: int) -> _Loaded:
        cached = self._functions.get(device)
        if cached is not None:
            return cached
        driver = _driver()
        handle = self.module.handle(device)
        function = _check(
            driver.cuModuleGetFunction(handle, self.name.encode()),
            f"cuModuleGetFunction {self.name}",
        )
        params = list(self.signature.params)
        image = _image_layout(driver, function, len(params))
        if image is None:
            natural = natural_layout(self.signature.params)
            if natural is None:
                raise LaunchError(
                    f"kernel {self.signature.describe()}: a parameter of unknown size and no "
                    "cuFuncGetParamInfo in this driver; declare it with a plain C type"
                )
            offsets, total = natural
        else:
            offsets, sizes, total = image
            for index, (param, size) in enumerate(zip(params, sizes, strict=True)):
                if param.kind == "opaque":
                    params[index] = replace(param, size=size)
                elif param.size != size:
                    raise LaunchError(
                        f"kernel {self.signature.describe()}: parameter {index} "
                        f"({param.ctype!r}) is {size} bytes in the cubin but {param.size} as "
                        "parsed from the source; declare the parameters with plain C types"
                    )
        fmt = _struct(params, offsets, total)
        buffer = ctypes.create_string_buffer(max(fmt.size, 1))
        base = ctypes.addressof(buffer)
        pointers = (ctypes.c_void_p * max(len(offsets), 1))(*(base + o for o in offsets))
        loaded = _Loaded(function, tuple(params), fmt, buffer, pointers)
        self._functions[device] = loaded
        return loaded

    def __call__(
        self,
        *args: Any,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        import torch

        gx, gy, gz = dims(grid, "grid")
        bx, by, bz = dims(block, "block")
        if len(args) != len(self.signature.params):
            raise LaunchError(
                f"kernel {self.signature.describe()} takes {len(self.signature.params)} "
                f"argument(s), got {len(args)}"
            )
        device = _device_of(args)
        with self._lock:
            loaded = self._function(device)
            driver = _driver()
            if shared_mem > MAX_STATIC_SHARED and shared_mem > loaded.shared_opt_in:
                _check(
                    driver.cuFuncSetAttribute(
                        loaded.function,
                        driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        int(shared_mem),
                    ),
                    f"setting {shared_mem} bytes of dynamic shared memory for {self.name}",
                )
                loaded.shared_opt_in = int(shared_mem)
            loaded.fmt.pack_into(loaded.buffer, 0, *self._values(loaded.params, args))
            if stream is None:
                handle = torch.cuda.current_stream(device).cuda_stream
            else:
                handle = int(getattr(stream, "cuda_stream", stream))
            _check(
                driver.cuLaunchKernel(
                    loaded.function, gx, gy, gz, bx, by, bz, int(shared_mem), handle,
                    ctypes.addressof(loaded.pointers), 0,
                ),
                f"launching {self.name} (grid {(gx, gy, gz)}, block {(bx, by, bz)}, "
                f"{shared_mem} B dynamic shared memory)",
            )  # fmt: skip


@dataclass
class _Loaded:
    """A kernel loaded on one device: its function, packing and reusable argument buffer."""

    function: Any
    params: tuple[Param, ...]
    fmt: struct.Struct
    buffer: Any
    pointers: Any
    shared_opt_in: int = 0


def _struct(params: Sequence[Param], offsets: Sequence[int], total: int) -> struct.Struct:
    """A `struct` format placing each parameter at its offset, padded to `total` bytes."""
    parts, position = ["<"], 0
    for param, offset in zip(params, offsets, strict=True):
        parts.append("x" * (offset - position))
        parts.append(param.code if param.kind != "opaque" else f"{param.size}s")
        position = offset + param.size
    parts.append("x" * max(0, total - position))
    return struct.Struct("".join(parts))


def _device_of(args: Sequence[Any]) -> int:
    import torch

    for arg in args:
        device = getattr(arg, "device", None)
        if device is not None and getattr(device, "type", None) == "cuda":
            return device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.current_device()


def _image_layout(
    driver: Any, function: Any, count: int
) -> tuple[list[int], list[int], int] | None:
    """Offsets, sizes and total size of the parameters as the kernel image records them
    (None when the driver has no cuFuncGetParamInfo, CUDA < 12.4)."""
    getter = getattr(driver, "cuFuncGetParamInfo", None)
    if getter is None:
        return None
    offsets, sizes = [], []
    for index in range(count):
        result = getter(function, index)
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            if index == 0:
                return None
            raise LaunchError(
                f"the kernel image has {index} parameter(s), the source declares {count}"
            )
        offsets.append(int(result[1]))
        sizes.append(int(result[2]))
    if getter(function, count)[0] == driver.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"the kernel image has more than the {count} parameter(s) in the source")
    total = max((o + s for o, s in zip(offsets, sizes, strict=True)), default=0)
    return offsets, sizes, total


class CudaModule:
    """A built cubin and its `extern "C"` kernels, loaded on first launch (per device).

    `module.name_of_kernel(*args, grid=..., block=..., shared_mem=...)` launches;
    `module.cubin_path` is the cubin (for `cuobjdump --dump-sass` and ncu);
    `module.build` describes the build (cache key, hit or miss, seconds, log).
    """

    def __init__(
        self,
        cubin_path: str | Path,
        kernels: Mapping[str, KernelSignature],
        build: Mapping[str, Any] | None = None,
    ) -> None:
        self.cubin_path = Path(cubin_path)
        self.signatures = dict(kernels)
        self.build = dict(build or {})
        self._kernels = {name: CudaKernel(self, sig) for name, sig in self.signatures.items()}
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<CudaModule {self.cubin_path} kernels={sorted(self._kernels)}>"

    def __getattr__(self, name: str) -> CudaKernel:
        kernels = self.__dict__.get("_kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(
            f'{name!r} is not an extern "C" kernel of this module (kernels: '
            f'{", ".join(sorted(kernels)) or "none"}); declare it `extern "C" __global__`'
        )

    def kernel(self, name: str) -> CudaKernel:
        """The kernel called `name`."""
        return getattr(self, name)

    @property
    def kernels(self) -> dict[str, CudaKernel]:
        return dict(self._kernels)

    def handle(self, device: int) -> Any:
        """The driver module on `device` (loaded into its primary context on first use)."""
        with self._lock:
            if device in self._handles:
                return self._handles[device]
            import torch

            driver = _driver()
            torch.cuda.init()
            _check(driver.cuInit(0), "cuInit")
            cu_device = _check(driver.cuDeviceGet(device), "cuDeviceGet")
            context = _check(driver.cuDevicePrimaryCtxRetain(cu_device), "cuDevicePrimaryCtxRetain")
            _check(driver.cuCtxSetCurrent(context), "cuCtxSetCurrent")
            image = self.cubin_path.read_bytes()
            handle = _check(driver.cuModuleLoadData(image), f"loading {self.cubin_path}")
            self._handles[device] = handle
            return handle
