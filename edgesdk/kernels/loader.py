"""Board side: load the AOT cubins of ``kernels/sm_XX/`` and launch them, with no Triton on the board.

Everything goes through the CUDA driver API (CUDA Driver API reference: ``cuModuleLoadData``,
``cuModuleGetFunction``, ``cuFuncSetAttribute``, ``cuLaunchKernel``; ``cuModuleUnload`` and ``cuMemFree`` when
:meth:`CompiledKernels.close` gives the modules and scratch back), reached through

1. ``cuda-python`` (``cuda.bindings.driver``, or ``cuda.cuda`` in releases before 12.6) when importable, else
2. ``libcuda.so.1`` via ctypes when a CUDA build of PyTorch sees a GPU (the driver PyTorch itself runs on; its
   primary context and current stream are used),

and otherwise :func:`load_compiled` raises a ``RuntimeError`` naming both. Kernel parameters follow Triton's
launcher (``triton/backends/nvidia/driver.c``): the runtime parameters in signature order (constexprs are baked
into the cubin), then the global-scratch and profile-scratch pointers. A cubin is loaded when its SM equals the
device's; otherwise the PTX is loaded, which the driver JIT-compiles for a newer device (PTX is forward-compatible,
except arch-specific ``sm_90a`` code, what Triton writes for sm_90 and later: that is refused by name).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import operator
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_MAX_DYNAMIC_SHARED_ATTR = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory above this needs the opt-in attribute
_MAX_THREADS_PER_BLOCK = 1024  # every compute capability (CUDA C++ Programming Guide, technical specs)
_CTYPES = {"i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64,
           "fp32": ctypes.c_float, "fp64": ctypes.c_double, "i1": ctypes.c_bool}
_INT_RANGES = {"i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-(2**63), 2**63 - 1),
               "u64": (0, 2**64 - 1)}
_GRID_LIMITS = (2**31 - 1, 65535)  # gridDim.x; gridDim.y and z (CUDA C++ Programming Guide, technical specs)
# element type of a pointer parameter -> the torch dtype (as str) a tensor passed for it must have
_POINTEE_DTYPES = {"i8": "torch.int8", "u8": "torch.uint8", "i32": "torch.int32", "i64": "torch.int64",
                   "fp16": "torch.float16", "bf16": "torch.bfloat16", "fp32": "torch.float32",
                   "fp64": "torch.float64"}


class KernelLoadError(RuntimeError):
    """The compiled kernels cannot be loaded or launched here."""


class _OutOfMemory(KernelLoadError):
    """A driver call answered CUDA_ERROR_OUT_OF_MEMORY."""


_CUDA_ERROR_OUT_OF_MEMORY = 2


def _out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a device allocation refused for want of memory: the driver's CUDA_ERROR_OUT_OF_MEMORY
    (:class:`_OutOfMemory`), or PyTorch's ``torch.cuda.OutOfMemoryError`` (the libcuda path allocates through
    torch)."""
    if isinstance(error, _OutOfMemory):
        return True
    torch = sys.modules.get("torch")
    torch_oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return isinstance(torch_oom, type) and isinstance(error, torch_oom)


def _missing_backend_message(detail: str) -> str:
    return ("launching the AOT kernels needs the CUDA driver through cuda-python (pip install cuda-python; "
            "module cuda.bindings.driver) or through a CUDA build of PyTorch that sees a GPU; " + detail)


# ---------------------------------------------------------------------------------------------- driver backends
class _CudaPythonDriver:
    name = "cuda-python"
    host_memory = False  # kernels read device memory only (see LoadedKernel.launch)

    def __init__(self, driver: Any, device: int) -> None:
        self.d = driver
        self._retained: Any = None  # the device whose primary context this driver retained, if it did
        self._check(driver.cuInit(0), "cuInit")
        ctx = self._check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if ctx is None or int(ctx) == 0:
            dev = self._check(driver.cuDeviceGet(device), "cuDeviceGet")
            ctx = self._check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            self._retained = dev  # released by close()
        # the modules' context: pushed around each call (:meth:`_current`) and popped after it, so the caller's
        # current context (PyTorch's, or none) is the current one again, on whatever thread the call came from
        self.context = ctx
        try:
            with self._current():
                self.device = self._check(driver.cuCtxGetDevice(), "cuCtxGetDevice")
        except BaseException:
            _release_on_failure(self)  # no driver is returned, so nothing else would release the retention
            raise

    @contextlib.contextmanager
    def _current(self) -> Iterator[None]:
        """Make the modules' context current for the calls inside (``cuCtxPushCurrent``), then the caller's again
        (``cuCtxPopCurrent``): ``cuCtxSetCurrent`` would replace the context the caller had current."""
        self._check(self.d.cuCtxPushCurrent(self.context), "cuCtxPushCurrent")
        try:
            yield
        except BaseException:
            self.d.cuCtxPopCurrent()  # the error inside is the one to report
            raise
        self._check(self.d.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def _check(self, result: Any, what: str) -> Any:
        err, *values = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            name = self.d.cuGetErrorName(err)
            text = name[1].decode() if isinstance(name, tuple) and name[1] else str(err)
            kind = _OutOfMemory if int(err) == _CUDA_ERROR_OUT_OF_MEMORY else KernelLoadError
            raise kind(f"{what} failed: {text}")
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)

    def capability(self) -> int:
        attr = self.d.CUdevice_attribute
        major = self._check(self.d.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device), "cuDeviceGetAttribute")
        minor = self._check(self.d.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device), "cuDeviceGetAttribute")
        return int(major) * 10 + int(minor)

    def load(self, image: bytes, kernel_name: str, shared: int) -> Any:
        buffer = ctypes.create_string_buffer(image, len(image) + 1)  # NUL-terminated (PTX needs it)
        with self._current():
            module = self._check(self.d.cuModuleLoadData(ctypes.addressof(buffer)), "cuModuleLoadData")
            try:  # a module whose kernel cannot be set up is unloaded here: no handle to it is returned
                func = self._check(self.d.cuModuleGetFunction(module, kernel_name.encode()), "cuModuleGetFunction")
                if shared > _DEFAULT_SHARED_LIMIT:
                    attr = self.d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                    self._check(self.d.cuFuncSetAttribute(func, attr, shared), "cuFuncSetAttribute")
            except BaseException:
                self.d.cuModuleUnload(module)
                raise
        return (module, func)

    def unload(self, handle: Any) -> None:
        """Unload the module of a :meth:`load` handle (``cuModuleUnload``)."""
        with self._current():
            self._check(self.d.cuModuleUnload(handle[0]), "cuModuleUnload")

    def launch(self, handle: Any, grid: tuple[int, int, int], threads: int, shared: int, stream: int,
               params_address: int) -> None:
        with self._current():
            self._check(self.d.cuLaunchKernel(handle[1], *grid, threads, 1, 1, shared, stream, params_address, 0),
                        "cuLaunchKernel")

    def alloc(self, nbytes: int) -> tuple[int, Any]:
        with self._current():
            ptr = self._check(self.d.cuMemAlloc(nbytes), "cuMemAlloc")
        return int(ptr), ptr

    def free(self, owner: Any) -> None:
        """Give back an :meth:`alloc` buffer (``cuMemFree``; its ``owner``, the ``CUdeviceptr``)."""
        with self._current():
            self._check(self.d.cuMemFree(owner), "cuMemFree")

    def synchronize(self) -> None:
        """Wait for the work launched so far (``cuCtxSynchronize``), before its modules and buffers go."""
        with self._current():
            self._check(self.d.cuCtxSynchronize(), "cuCtxSynchronize")

    def close(self) -> None:
        """Release the primary context this driver retained (``cuDevicePrimaryCtxRelease``), once."""
        device, self._retained = self._retained, None
        if device is not None:
            self._check(self.d.cuDevicePrimaryCtxRelease(device), "cuDevicePrimaryCtxRelease")


class _LibcudaDriver:
    """The driver library PyTorch loaded, through ctypes (used when cuda-python is absent)."""

    name = "libcuda (torch)"
    host_memory = False

    def __init__(self, device: int) -> None:
        import torch

        torch.cuda.init()
        torch.cuda.set_device(device)
        torch.cuda.current_stream(device)  # makes torch's primary context current on this thread
        try:
            self.lib = _open_libcuda()
        except OSError as exc:
            raise KernelLoadError(_missing_backend_message(f"libcuda.so.1 did not load ({exc})")) from exc
        lib = self.lib
        self._retained: int | None = None  # the device whose primary context this driver retained, if it did
        vp, pvp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        lib.cuInit.argtypes = [ctypes.c_uint]
        lib.cuCtxGetCurrent.argtypes = [pvp]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.cuDevicePrimaryCtxRetain.argtypes = [pvp, ctypes.c_int]
        # cuda.h maps these names to their _v2 entry points (CUDA 4.0: the context stack; CUDA 11.0:
        # cuDevicePrimaryCtxRelease): the unversioned exports keep the old semantics for binaries built before
        lib.cuCtxPushCurrent_v2.argtypes = [vp]
        lib.cuCtxPopCurrent_v2.argtypes = [pvp]
        lib.cuModuleLoadData.argtypes = [pvp, vp]
        lib.cuModuleUnload.argtypes = [vp]
        lib.cuDevicePrimaryCtxRelease_v2.argtypes = [ctypes.c_int]
        lib.cuModuleGetFunction.argtypes = [pvp, vp, ctypes.c_char_p]
        lib.cuFuncSetAttribute.argtypes = [vp, ctypes.c_int, ctypes.c_int]
        lib.cuLaunchKernel.argtypes = [vp] + [ctypes.c_uint] * 7 + [vp, pvp, pvp]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._check(lib.cuInit(0), "cuInit")
        ctx = ctypes.c_void_p()
        self._check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            dev = ctypes.c_int()
            self._check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
            self._check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self._retained = dev.value  # released by close()
        self.context = ctx  # the modules' context, pushed around each call (:meth:`_current`)
        try:
            major, minor = torch.cuda.get_device_capability(device)
        except BaseException:
            _release_on_failure(self)  # no driver is returned, so nothing else would release the retention
            raise
        self._capability = major * 10 + minor

    def _check(self, err: int, what: str) -> None:
        if err != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(err, ctypes.byref(name))
            kind = _OutOfMemory if err == _CUDA_ERROR_OUT_OF_MEMORY else KernelLoadError
            raise kind(f"{what} failed: {(name.value or b'CUDA error %d' % err).decode()}")

    def capability(self) -> int:
        return self._capability

    @contextlib.contextmanager
    def _current(self) -> Iterator[None]:
        """Make the modules' context current for the calls inside (``cuCtxPushCurrent_v2``), then the caller's
        again (``cuCtxPopCurrent_v2``): ``cuCtxSetCurrent`` would replace the context the caller had current."""
        self._check(self.lib.cuCtxPushCurrent_v2(self.context), "cuCtxPushCurrent")
        popped = ctypes.c_void_p()
        try:
            yield
        except BaseException:
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(popped))  # the error inside is the one to report
            raise
        self._check(self.lib.cuCtxPopCurrent_v2(ctypes.byref(popped)), "cuCtxPopCurrent")

    def load(self, image: bytes, kernel_name: str, shared: int) -> Any:
        buffer = ctypes.create_string_buffer(image, len(image) + 1)
        module, func = ctypes.c_void_p(), ctypes.c_void_p()
        with self._current():
            self._check(self.lib.cuModuleLoadData(ctypes.byref(module), ctypes.addressof(buffer)),
                        "cuModuleLoadData")
            try:  # a module whose kernel cannot be set up is unloaded here: no handle to it is returned
                self._check(self.lib.cuModuleGetFunction(ctypes.byref(func), module, kernel_name.encode()),
                            "cuModuleGetFunction")
                if shared > _DEFAULT_SHARED_LIMIT:
                    self._check(self.lib.cuFuncSetAttribute(func, _MAX_DYNAMIC_SHARED_ATTR, shared),
                                "cuFuncSetAttribute")
            except BaseException:
                self.lib.cuModuleUnload(module)
                raise
        return (module, func)

    def unload(self, handle: Any) -> None:
        """Unload the module of a :meth:`load` handle (``cuModuleUnload``)."""
        with self._current():
            self._check(self.lib.cuModuleUnload(handle[0]), "cuModuleUnload")

    def launch(self, handle: Any, grid: tuple[int, int, int], threads: int, shared: int, stream: int,
               params_address: int) -> None:
        params = ctypes.cast(ctypes.c_void_p(params_address), ctypes.POINTER(ctypes.c_void_p))
        with self._current():
            self._check(self.lib.cuLaunchKernel(handle[1], *grid, threads, 1, 1, shared, ctypes.c_void_p(stream),
                                                params, None), "cuLaunchKernel")

    def alloc(self, nbytes: int) -> tuple[int, Any]:
        import torch

        buffer = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        return buffer.data_ptr(), buffer

    def free(self, owner: Any) -> None:
        """Give back an :meth:`alloc` buffer: a torch tensor, which goes back to torch's allocator when its last
        reference (``owner``, dropped by the caller) goes."""

    def synchronize(self) -> None:
        """Wait for the work launched so far, before its modules and buffers go."""
        import torch

        torch.cuda.synchronize()

    def close(self) -> None:
        """Release the primary context this driver retained (``cuDevicePrimaryCtxRelease_v2``), once."""
        device, self._retained = self._retained, None
        if device is not None:
            self._check(self.lib.cuDevicePrimaryCtxRelease_v2(device), "cuDevicePrimaryCtxRelease")


def _release_on_failure(driver: Any) -> None:
    """Release the primary context a driver backend retained before its ``__init__`` failed: the error being
    raised is the one to report, so a failed release is not raised over it."""
    with contextlib.suppress(Exception):
        driver.close()


def _open_libcuda() -> Any:
    """The CUDA driver library (the one a CUDA build of PyTorch runs on)."""
    return ctypes.CDLL("libcuda.so.1")


def _import_cuda_python() -> Any | None:
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6
        except ImportError:
            return None
    return driver


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def select_driver(backend: str | None = None, device: int = 0):
    """The driver backend: ``"cuda-python"``, ``"torch"`` or None (the first that works, in that order).

    An importable cuda-python that cannot reach a GPU (no ``libcuda.so.1``: cuda-pathfinder's
    ``DynamicLibNotFoundError``, as in a container started without the NVIDIA runtime; ``cuInit`` failing with
    ``CUDA_ERROR_NO_DEVICE``) does not end the search: the torch backend is tried next. Raises
    :class:`KernelLoadError` naming every backend tried and why each did not work."""
    if backend not in (None, "cuda-python", "torch"):
        raise ValueError(f"backend must be 'cuda-python', 'torch' or None, got {backend!r}")
    failures = []
    if backend in (None, "cuda-python"):
        driver = _import_cuda_python()
        if driver is None:
            failures.append("cuda-python is not importable")
        else:
            try:
                return _CudaPythonDriver(driver, device)
            except Exception as exc:  # noqa: BLE001 - a missing driver library is a RuntimeError, not a CUresult
                failures.append(f"cuda-python is installed but did not reach a GPU ({type(exc).__name__}: {exc})")
        if backend == "cuda-python":  # the driver hint only where cuda-python is there but saw no GPU
            raise KernelLoadError(_missing_backend_message(failures[0] + (_NO_DRIVER_HINT if driver else "")))
    if _torch_cuda():
        return _LibcudaDriver(device)
    failures.append("torch.cuda is not available (no torch, a CPU-only build, or no visible GPU)")
    raise KernelLoadError(_missing_backend_message(" and ".join(failures) + _NO_DRIVER_HINT))


# what to check when no backend sees a GPU
_NO_DRIVER_HINT = ("; check that the NVIDIA driver is installed and the GPU visible here (a container needs the "
                   "NVIDIA runtime: docker run --runtime nvidia, as jetson-containers starts it)")


# ---------------------------------------------------------------------------------------------- kernels
def _pointer(value: Any) -> int:
    if isinstance(value, int):
        return value
    if hasattr(value, "data_ptr"):
        return int(value.data_ptr())
    if hasattr(value, "__cuda_array_interface__"):
        return int(value.__cuda_array_interface__["data"][0])
    raise TypeError(f"cannot pass {type(value).__name__} as a device pointer")


def _stream_handle(stream: Any) -> int:
    if stream is None:
        try:
            import torch

            if torch.cuda.is_available():
                return int(torch.cuda.current_stream().cuda_stream)
        except ImportError:
            pass
        return 0  # the legacy default stream
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    return int(stream)


@dataclass
class LoadedKernel:
    """One compiled variant, loaded: ``launch(grid, *params)`` with params in ``meta["params"]`` order. A launch
    refuses, naming the parameter: None for a pointer, a tensor of another dtype than compiled, an unaligned
    pointer, an integer outside its compiled type, a grid past CUDA's limits, and (on a CUDA driver,
    ``host_memory`` False) a tensor that is not on the GPU, as Triton's launcher does ("cannot be accessed from
    Triton (cpu tensor?)")."""

    meta: dict
    driver: Any
    handle: Any
    source: str  # "cubin" or "ptx"
    _scratch: dict = field(default_factory=dict, repr=False)
    # scratch a larger grid outgrew: kept to :meth:`close`, as a captured CUDA graph may still launch with it
    _outgrown: list = field(default_factory=list, repr=False)
    closed: bool = field(default=False, repr=False)

    @property
    def name(self) -> str:
        return self.meta["name"]

    def grid(self, sizes: Mapping[str, int]) -> tuple[int, int, int]:
        """Evaluate the metadata's grid rule; names resolve in ``sizes`` and then in the constexprs."""
        values = {**self.meta["constexprs"], **sizes}
        dims = []
        for dim in self.meta["grid"]["dims"]:
            if isinstance(dim, int):
                dims.append(dim)
            elif isinstance(dim, str):
                dims.append(int(values[dim]))
            else:
                _, num, den = dim  # ["cdiv", numerator, denominator]
                dims.append(-(-int(values[num]) // int(values[den])))
        return tuple(dims)  # type: ignore[return-value]

    def _scratch_pointer(self, kind: str, grid: tuple[int, int, int]) -> int:
        size = int(self.meta.get(f"{kind}_scratch_size", 0))
        if size <= 0:
            return 0
        total = size * grid[0] * grid[1] * grid[2]
        held = self._scratch.get(kind)
        if held is None or held[0] < total:
            # at least twice the outgrown one: a demand growing a little at a time allocates a logarithmic number
            # of buffers, each of which stays until close (a captured CUDA graph may still launch with it)
            nbytes = total if held is None else max(total, 2 * held[0])
            try:
                ptr, owner = self.driver.alloc(nbytes)
            except Exception as error:
                if nbytes == total or not _out_of_memory(error):
                    raise
                # the doubled size does not fit where the size asked for may: 6 GiB outgrown by 6.1 asks for 12
                nbytes = total
                ptr, owner = self.driver.alloc(nbytes)
            if held is not None:
                self._outgrown.append(held[2])
            self._scratch[kind] = (nbytes, ptr, owner)
        return self._scratch[kind][1]

    def close(self) -> None:
        """Free its scratch buffers (``cuMemFree``) and unload its module (``cuModuleUnload``) now, rather than
        never: each :func:`load_compiled` held them for the life of the process. A later launch is refused by
        name; closing again does nothing. A driver error is raised once, after every step was tried. The caller
        waits for the kernel's work first (:meth:`CompiledKernels.close`)."""
        if self.closed:
            return
        self.closed = True
        buffers = [owner for _, _, owner in self._scratch.values()] + self._outgrown
        self._scratch, self._outgrown = {}, []
        _run_all([lambda owner=owner: self.driver.free(owner) for owner in buffers]
                 + [lambda: self.driver.unload(self.handle)])

    def launch(self, grid: tuple[int, ...], *params: Any, stream: Any = None) -> None:
        if self.closed:
            raise KernelLoadError(f"launch of kernel {self.name} after close(), which unloaded its module and freed "
                                  "its scratch: load the kernels again (load_compiled), or open the bundle again "
                                  "(edgesdk.load, or open_runtime); closed kernels stay closed")
        specs = self.meta["params"]
        if len(params) != len(specs):
            raise TypeError(f"{self.name} takes {len(specs)} parameters ({', '.join(n for n, _ in specs)}), "
                            f"got {len(params)}")
        grid3 = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        holders: list[Any] = []
        alignment = _pointer_alignment(self.meta)
        device_only = not getattr(self.driver, "host_memory", True)
        for (name, ty), value in zip(specs, params, strict=True):
            if ty.startswith("*"):
                if value is None:  # no kernel here has an optional pointer: it would read address 0
                    raise ValueError(f"{self.name}: {name} is {ty} (compiled so), got None: the kernel would read "
                                     f"address 0 and fault (leaving the CUDA context unusable); pass a GPU tensor")
                where = getattr(getattr(value, "device", None), "type", None)
                if device_only and where is not None and where != "cuda":
                    raise ValueError(f"{self.name}: {name} is a {where} tensor, which the GPU cannot read (the "
                                     f"kernel would fault and leave the CUDA context unusable): move it to the GPU "
                                     f"(.cuda()); Triton's own launcher refuses it too")
                expected = _POINTEE_DTYPES.get(ty[1:])
                got = getattr(value, "dtype", None)
                if expected is not None and got is not None and str(got) != expected:
                    raise TypeError(f"{self.name}: {name} is {ty} (compiled so), got a {got} tensor: the kernel "
                                    f"would read its bytes as {ty[1:]}; pass a {expected} tensor")
                address = _pointer(value)
                if address % alignment:
                    raise ValueError(f"{self.name}: {name} must be {alignment}-byte aligned (compiled so); got "
                                     f"{address:#x}: pass a fresh copy (.clone()), not an offset view (.contiguous() "
                                     "returns a contiguous view as it is, offset included)")
                holders.append(ctypes.c_void_p(address))
            elif ty in _INT_RANGES:
                low, high = _INT_RANGES[ty]
                try:
                    number = operator.index(value)  # ints, numpy / 0-d torch integers; not floats
                except TypeError:
                    raise TypeError(f"{self.name}: {name} is {ty} (compiled so), got {value!r}: pass an "
                                    "integer") from None
                if not low <= number <= high:
                    raise ValueError(f"{self.name}: {name} is {ty} (compiled so), got {number}: an integer in "
                                     f"[{low}, {high}] is expected (ctypes would wrap it silently)")
                holders.append(_CTYPES[ty](number))
            elif ty in _CTYPES:
                holders.append(_CTYPES[ty](value))
            else:
                raise TypeError(f"parameter {name} has unsupported type {ty}")
        if len(grid3) != 3 or min(grid3) < 0 or grid3[0] > _GRID_LIMITS[0] or max(grid3[1:]) > _GRID_LIMITS[1]:
            raise ValueError(f"{self.name}: grid {grid3} is outside CUDA's limits (x <= {_GRID_LIMITS[0]}, "
                             f"y, z <= {_GRID_LIMITS[1]}, none negative)")
        if 0 in grid3:
            return  # an empty problem (no rows, no outputs): nothing to launch, as Triton's own launcher does
        holders.append(ctypes.c_void_p(self._scratch_pointer("global", grid3)))
        holders.append(ctypes.c_void_p(self._scratch_pointer("profile", grid3)))
        array = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        self.driver.launch(self.handle, grid3, int(self.meta["threads_per_block"]),
                           int(self.meta["shared_memory_bytes"]), _stream_handle(stream), ctypes.addressof(array))


def _run_all(steps) -> None:
    """Run every one of ``steps`` (callables), then raise the first error one of them raised: a module that does
    not unload leaves the others to be given back all the same."""
    first: BaseException | None = None
    for step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - KernelLoadError of a driver call, or whatever a stand-in raises
            first = first or exc
    if first is not None:
        raise first


# the fix for a call no compiled variant fits
_REBUILD_FOR_MODEL = ("the kernels were compiled for another model's shapes; rebuild the bundle with this edgesdk, "
                      "which compiles the variants its model needs")
_TORCH_DTYPES = {"fp16": "float16", "fp32": "float32", "bf16": "bfloat16"}


def _aligned(tensor, alignment: int):
    """``tensor``, or a copy of it when its address is not a multiple of ``alignment`` (a variant's
    ``pointer_alignment``): a contiguous view at an offset (``buffer[1:]``, one of a fused projection's parts),
    which Triton's JIT launches by specialising the kernel for it, and which an AOT kernel compiled for aligned
    pointers would refuse."""
    return tensor if tensor.data_ptr() % alignment == 0 else tensor.clone()


def _is_gemm(meta: dict) -> bool:
    """Whether a bsr_matmul variant is the GEMM (row tiles of 16 or more, for prefill) rather than the GEMV (one
    row per program). Told by BLOCK_M, not USE_DOT: blocks under 16 x 16 compile their GEMM without tl.dot."""
    return int(meta["constexprs"]["BLOCK_M"]) >= 16


def _variant_tuning(meta: dict, device: Any):
    """The tuning a variant was compiled with, its SM count replaced by this device's (AGX Orin has twice an
    Orin NX's), then the launch-time fields (:data:`.tuning.RUNTIME_FIELDS`) that ``EDGESDK_KERNEL_TUNING``
    sets; the rest is compiled into the cubin (``open_triton_backend`` refuses overriding it)."""
    import dataclasses
    import os

    import torch

    from .tuning import RUNTIME_FIELDS, TUNING_ENV_VAR, KernelTuning, parse_tuning_overrides

    fields = {f.name for f in dataclasses.fields(KernelTuning)}
    stored = {key: value for key, value in meta.get("tuning", {}).items() if key in fields}
    stored["bsr_block"] = tuple(stored.get("bsr_block", (32, 32)))
    stored.setdefault("sm", int(meta["sm"]))
    stored.setdefault("shared_memory_kb", 100)
    stored.setdefault("sm_count", 8)
    if getattr(device, "type", None) == "cuda" and torch.cuda.is_available():
        stored["sm_count"] = torch.cuda.get_device_properties(device).multi_processor_count
    overrides = parse_tuning_overrides(os.environ.get(TUNING_ENV_VAR, ""))
    stored.update({name: value for name, value in overrides.items() if name in RUNTIME_FIELDS})
    return KernelTuning(**stored)


class CompiledKernels(Mapping[str, LoadedKernel]):
    """The loaded variants of one ``sm_XX`` directory, by name; ``failed`` lists what the compiler refused."""

    def __init__(self, sm: int, kernels: dict[str, LoadedKernel], failed: dict[str, str], backend: str,
                 driver: Any = None) -> None:
        self.sm, self._kernels, self.failed, self.backend = sm, kernels, failed, backend
        self._tunings: dict[tuple[str, str, str], Any] = {}  # (variant, device, overrides) -> split-K tuning
        # the driver the kernels were loaded through (select_driver): its context is released by close()
        self.driver = driver if driver is not None else next((k.driver for k in kernels.values()), None)
        self.closed = False

    def close(self) -> None:
        """Give back what the loaded kernels hold on the GPU now: once the work launched so far is done, every
        variant's module is unloaded and its scratch freed (:meth:`LoadedKernel.close`), and the primary context
        the driver retained is released. Every later launch is a KernelLoadError naming the kernel; closing again
        does nothing. A driver error is raised once, after every step was tried."""
        if self.closed:
            return
        self.closed = True
        driver = self.driver
        steps = [kernel.close for kernel in self._kernels.values()]
        if driver is not None:
            steps = [driver.synchronize, *steps, driver.close]
        _run_all(steps)

    def __getitem__(self, name: str) -> LoadedKernel:
        return self._kernels[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kernels)

    def __len__(self) -> int:
        return len(self._kernels)

    @property
    def attention_dtype(self):
        """The torch dtype the compiled decode attention reads the KV cache in (its variants' ``act_dtype``); a
        cache held in it is passed as is, any other is converted on every call."""
        import torch

        acts = {k.meta["act_dtype"] for k in self._kernels.values() if k.meta["kernel"] == "gqa_decode"}
        return getattr(torch, _TORCH_DTYPES[acts.pop()]) if len(acts) == 1 else torch.float32

    def missing(self, block: tuple[int, int], layout: str, head_dim: int, groups, windows=None) -> list[str]:
        """What a model with ``block`` weights in ``layout``, heads of ``head_dim``, query groups ``groups``
        (Hq // Hkv per layer) and ``windows`` (per layer, the same order: its sliding window, None for full
        attention; None: no layer has one) needs and these kernels lack, one line each; empty when every call will
        find a variant. Checked when a bundle is opened, so a gap is reported there and not at the first token."""
        want_t = layout == "transposed"
        lacking = []
        for gemm, what in ((False, "GEMV (decode, < 16 rows)"), (True, "GEMM (prefill, >= 16 rows)")):
            if not any(k.meta["kernel"] == "bsr_matmul" and _is_gemm(k.meta) == gemm
                       and k.meta["constexprs"]["TRANSPOSED"] == want_t
                       and (k.meta["constexprs"]["BLOCK_N"], k.meta["constexprs"]["BLOCK_K"]) == tuple(block)
                       for k in self._kernels.values()):
                lacking.append(f"bsr_matmul {what} for {block[0]}x{block[1]} {layout} blocks")
        groups = list(groups)
        windows = [None] * len(groups) if windows is None else list(windows)
        for group, window in sorted(set(zip(groups, windows, strict=True)), key=lambda pair: (pair[0], pair[1] or 0)):
            if not any(k.meta["kernel"] == "gqa_decode" and k.meta["constexprs"]["BLOCK_D"] >= head_dim
                       and k.meta["constexprs"]["BLOCK_G"] >= group and _window(k.meta) == (window or 0)
                       for k in self._kernels.values()):
                lacking.append(f"gqa_decode for head_dim {head_dim}, {group} query heads per KV head"
                               + (f", sliding window {window}" if window else ""))
        return lacking

    def _pick(self, kernel: str, accept, wanted: str) -> LoadedKernel:
        """The first ``kernel`` variant ``accept`` takes; ``wanted`` says what the call needs, for the error."""
        found = [k for k in self._kernels.values() if k.meta["kernel"] == kernel and accept(k.meta)]
        if not found:
            raise KernelLoadError(f"no compiled {kernel} variant for {wanted} (have: {sorted(self._kernels)}): "
                                  f"{_REBUILD_FOR_MODEL}")
        return found[0]

    def block_sparse_matmul(self, x, weight, stream: Any = None):
        """``x (M, K) -> (M, N)`` on the compiled BSR kernel (torch CUDA tensors; x cast to the variant's dtype, and
        copied when it is a view off the compiled pointer alignment).
        GEMV variants compiled with ``ATOMIC`` split each block row over programs (``tuning.gemv_splits`` with
        this device's SM count) and add into a zeroed float32 output. Raises ValueError for an x that is not
        ``(M, K)``, as the twin and the Triton launcher do (the kernel would read past x)."""
        import torch

        n, k = weight.shape
        if x.dim() != 2 or x.shape[1] != k:
            raise ValueError(f"x must be (M, K={k}), got {tuple(x.shape)}")
        m = x.shape[0]
        want_gemm = m >= 16
        layout = weight.layout == "transposed"
        variant = self._pick("bsr_matmul", lambda md: _is_gemm(md) == want_gemm
                             and md["constexprs"]["TRANSPOSED"] == layout
                             and (md["constexprs"]["BLOCK_N"], md["constexprs"]["BLOCK_K"]) == tuple(weight.block),
                             f"a {'GEMM (prefill, >= 16 rows)' if want_gemm else 'GEMV (decode, < 16 rows)'} of "
                             f"x {tuple(x.shape)} by {weight.block[0]}x{weight.block[1]} {weight.layout} blocks")
        dtype = getattr(torch, _TORCH_DTYPES[variant.meta["act_dtype"]])
        x = _aligned(x.to(dtype), _pointer_alignment(variant.meta))
        atomic = bool(variant.meta["constexprs"].get("ATOMIC", False))  # bundles before split-K have none
        splits = 1
        if atomic:
            import os

            from .tuning import TUNING_ENV_VAR, gemv_splits

            key = (variant.name, str(x.device), os.environ.get(TUNING_ENV_VAR, ""))  # the env var is read here
            if key not in self._tunings:
                self._tunings[key] = _variant_tuning(variant.meta, x.device)
            splits = gemv_splits(m * weight.block_rows, m * weight.nnz_blocks, self._tunings[key])
            out = torch.zeros(m, n, dtype=torch.float32, device=x.device)
        else:
            out = torch.empty(m, n, dtype=dtype, device=x.device)
        grid = variant.grid({"M": m, "N": n, "SPLIT": splits})
        variant.launch(grid, x, weight.values, weight.col_index, weight.row_offsets, weight.scales, out,
                       m, n, k, x.stride(0), x.stride(1), out.stride(0), out.stride(1), stream=stream)
        return out.to(dtype) if atomic else out

    def gqa_decode_attention(self, q, k_cache, v_cache, lengths, scale: float, stream: Any = None,
                             window: int | None = None):
        """Decode-step GQA on the compiled kernel: the smallest ``BLOCK_G >= Hq/Hkv`` variant of head dim D
        compiled for ``window`` (each query reads its last ``window`` positions, itself included; None: all, the
        variants without a ``WINDOW``, or with 0, compiled before windows included). Arguments are checked as the
        twin and the Triton launcher check them (:func:`.reference.check_decode_attention_args`: head counts,
        lengths in ``[0, T_max]``; :func:`.reference.check_window`). A tensor off the compiled pointer alignment (a
        view at an offset) is copied, as :meth:`block_sparse_matmul` copies x."""
        import torch

        from .reference import check_decode_attention_args, check_window

        b, hq, hkv, _, d = check_decode_attention_args(q, k_cache, v_cache, lengths)
        span = check_window(window)
        group = hq // hkv
        candidates = sorted((k for k in self._kernels.values() if k.meta["kernel"] == "gqa_decode"
                             and k.meta["constexprs"]["BLOCK_D"] >= d and k.meta["constexprs"]["BLOCK_G"] >= group
                             and _window(k.meta) == span),
                            key=lambda k: (k.meta["constexprs"]["BLOCK_D"], k.meta["constexprs"]["BLOCK_G"]))
        if not candidates:
            windowed = f", window={window}" if window is not None else ""
            raise KernelLoadError(f"no compiled gqa_decode variant for D={d}, group={group}{windowed} (have: "
                                  f"{sorted(self._kernels)}): {_REBUILD_FOR_MODEL}")
        variant = candidates[0]
        dtype = getattr(torch, _TORCH_DTYPES[variant.meta["act_dtype"]])
        alignment = _pointer_alignment(variant.meta)
        q, k_cache, v_cache = (_aligned(t.to(dtype), alignment) for t in (q, k_cache, v_cache))
        lengths = _aligned(lengths.to(device=q.device, dtype=torch.int32).contiguous(), alignment)
        out = torch.empty(b, hq, d, dtype=dtype, device=q.device)
        variant.launch(variant.grid({"B": b, "Hkv": hkv}), q, k_cache, v_cache, lengths, out, float(scale), group, d,
                       *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(), stream=stream)
        return out


def _window(meta: dict) -> int:
    """The sliding window a gqa_decode variant was compiled for (its ``WINDOW`` constexpr); 0: full attention, as
    every variant compiled before windows (they have no ``WINDOW``)."""
    return int(meta["constexprs"].get("WINDOW", 0))


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise KernelLoadError(f"{what} {path} is missing: the kernel directory is incomplete; copy the whole "
                              "bundle again (edgesdk deploy) or rebuild it") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KernelLoadError(f"{what} {path} is not readable JSON ({exc}): the kernel directory is damaged; "
                              "copy the whole bundle again (edgesdk deploy) or rebuild it") from exc


_KERNEL_CONSTEXPRS = {"bsr_matmul": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "TRANSPOSED"),
                      "gqa_decode": ("BLOCK_G", "BLOCK_D", "BLOCK_T")}
_SCRATCH_PARAMS = [["global_scratch", "*i8"], ["profile_scratch", "*i8"]]  # appended by LoadedKernel.launch


def _inside(kernel_dir: Path, name: Any, what: str, source: Path) -> Path:
    """``kernel_dir / name``, refused unless it names a file inside ``kernel_dir`` (no absolute path, no ``..``)."""
    path = kernel_dir / str(name)
    if not isinstance(name, str) or not name or "\0" in name or Path(name).is_absolute() \
            or not path.resolve().is_relative_to(kernel_dir.resolve()):  # a NUL: resolve() raised ValueError
        raise KernelLoadError(f"{source} names {what} {name!r}, which is not a file inside {kernel_dir}: the kernel "
                              "directory is damaged or was not written by edgesdk; copy the whole bundle again or "
                              "rebuild it")
    return path


def _expected_launch(meta: dict) -> tuple[list[list[str]], list]:
    """The runtime parameters and grid dims this loader's call sites (:meth:`CompiledKernels.block_sparse_matmul`,
    :meth:`CompiledKernels.gqa_decode_attention`) pass for a variant, from the tables of :mod:`.aot`."""
    from . import aot

    atomic = bool(meta["constexprs"].get("ATOMIC", False))
    variant = aot.KernelVariant(str(meta["name"]), meta["kernel"], {}, 1, 1, meta["act_dtype"],
                                out_dtype="fp32" if atomic else None)
    if meta["kernel"] == "gqa_decode":
        grid = aot._ATTN_GRID
    else:
        grid = aot._BSR_GEMV_GRID if atomic else aot._BSR_GRID
    return [list(p) for p in variant.params()], grid["dims"]


# constexprs that are tl.arange lengths or loop widths (each a power of two, or Triton would not have compiled it)
_TILE_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "UNROLL", "BLOCK_G", "BLOCK_D", "BLOCK_T")
_FLAG_CONSTEXPRS = ("TRANSPOSED", "USE_DOT", "ATOMIC")  # Python bools in aot's variant table (JSON true / false)
_MAX_WINDOW = 2**31 - 1  # reference.MAX_WINDOW: the kernel's positions are int32 (this module imports no torch)


def _whole(value: Any, least: int) -> bool:
    """Whether ``value`` is an integer (not a bool, not a float) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _power_of_two(value: Any) -> bool:
    return _whole(value, 1) and not value & (value - 1)


def _pointer_alignment(meta: dict) -> int:
    """The byte alignment a variant's pointers must have: its ``pointer_alignment``, or for metadata without one
    :data:`.aot.POINTER_ALIGNMENT`, the divisibility every edgesdk compile declares (a kernel that assumes it
    faults on an unaligned pointer, leaving the CUDA context unusable)."""
    from .aot import POINTER_ALIGNMENT

    return int(meta.get("pointer_alignment", POINTER_ALIGNMENT))


def _malformed_fields(meta: dict) -> list[str]:
    """The fields of ``meta`` this loader computes with (grid rules, variant choice, launch checks, scratch sizes)
    that do not hold what :mod:`.aot` writes, each with its value and what was expected: tile constexprs and
    ``num_warps`` / ``pointer_alignment`` positive powers of two, ``WINDOW`` an int32 >= 0, the flags booleans,
    scratch sizes integers >= 0. Absent optional fields are not errors (bundles from before them)."""
    constexprs = meta["constexprs"]
    found = []
    for name in _TILE_CONSTEXPRS:
        if name in constexprs and not _power_of_two(constexprs[name]):
            found.append(f"constexprs {name} is {constexprs[name]!r}, expected a positive power of two (a tile "
                         "length the kernel was compiled with)")
    window = constexprs.get("WINDOW", 0)
    if not _whole(window, 0) or window > _MAX_WINDOW:
        found.append(f"constexprs WINDOW is {window!r}, expected an integer in [0, {_MAX_WINDOW}] (0: full "
                     "attention)")
    for name in _FLAG_CONSTEXPRS:
        if name in constexprs and not isinstance(constexprs[name], bool):
            found.append(f"constexprs {name} is {constexprs[name]!r}, expected true or false")
    for key in ("num_warps", "pointer_alignment"):
        if key in meta and not _power_of_two(meta[key]):
            found.append(f"{key} is {meta[key]!r}, expected a positive power of two")
    for key in ("global_scratch_size", "profile_scratch_size"):
        if key in meta and not _whole(meta[key], 0):
            found.append(f"{key} is {meta[key]!r}, expected a byte count (an integer >= 0)")
    return found


def _check_meta(meta: Any, meta_path: Path, sm: int, index_path: Path) -> None:
    """Refuse metadata this loader would launch wrongly: a kernel it has no call site for, an activation dtype it
    cannot make, missing constexprs, fields it computes with that hold another type or range than the compiler
    writes (:func:`_malformed_fields`; a string ``BLOCK_D`` or a null ``WINDOW`` was a TypeError at the first
    token, a ``pointer_alignment`` of 0 a ZeroDivisionError), parameters (names, order, types) or a grid rule other
    than the ones it passes, a block size other than ``32 * num_warps`` (what the cubin was compiled for) or over
    CUDA's 1024 threads, scratch parameters other than the two it appends. Each error names the file, the field,
    what it holds and what was expected."""
    rebuild = "it was not written by this edgesdk's compiler; rebuild the bundle with this edgesdk"
    if not isinstance(meta, dict):
        raise KernelLoadError(f"kernel metadata {meta_path} is a {type(meta).__name__}, not an object: {rebuild}")
    if meta.get("sm") != sm:
        raise KernelLoadError(f"kernel metadata {meta_path} is for sm_{meta.get('sm')}, but {index_path} lists "
                              f"sm_{sm} kernels: the directory mixes targets; rebuild the bundle")
    missing_keys = [key for key in ("name", "kernel", "kernel_name", "act_dtype", "files", "params", "constexprs",
                                    "grid", "shared_memory_bytes", "threads_per_block") if key not in meta]
    if missing_keys:
        raise KernelLoadError(f"kernel metadata {meta_path} lacks {', '.join(missing_keys)}: {rebuild}")
    kernel = meta["kernel"]
    if not isinstance(kernel, str) or kernel not in _KERNEL_CONSTEXPRS:
        raise KernelLoadError(f"kernel metadata {meta_path}: kernel {kernel!r} is none this loader launches "
                              f"({', '.join(sorted(_KERNEL_CONSTEXPRS))}): {rebuild}")
    if not isinstance(meta["act_dtype"], str) or meta["act_dtype"] not in _TORCH_DTYPES:
        raise KernelLoadError(f"kernel metadata {meta_path}: act_dtype {meta['act_dtype']!r} is not one of "
                              f"{', '.join(sorted(_TORCH_DTYPES))}: {rebuild}")
    constexprs = meta["constexprs"]
    lacking = [name for name in _KERNEL_CONSTEXPRS[kernel] if not isinstance(constexprs, dict) or name not in constexprs]
    if lacking:
        raise KernelLoadError(f"kernel metadata {meta_path}: constexprs {constexprs!r} lack {', '.join(lacking)}: "
                              f"{rebuild}")
    malformed = _malformed_fields(meta)
    if malformed:
        raise KernelLoadError(f"kernel metadata {meta_path}: {'; '.join(malformed)}: {rebuild}")
    params, grid = _expected_launch(meta)
    if meta["params"] != params:
        raise KernelLoadError(f"kernel metadata {meta_path}: parameters {meta['params']!r}, but this loader passes "
                              f"{params!r} to a {kernel} kernel of {meta['act_dtype']}: {rebuild}")
    dims = meta["grid"].get("dims") if isinstance(meta["grid"], dict) else None
    if dims != grid:
        raise KernelLoadError(f"kernel metadata {meta_path}: grid dims {dims!r}, but a {kernel} kernel compiled "
                              f"with these constexprs is launched on {grid!r}: {rebuild}")
    trailing = meta.get("trailing_params", _SCRATCH_PARAMS)
    if trailing != _SCRATCH_PARAMS:
        raise KernelLoadError(f"kernel metadata {meta_path}: trailing parameters {trailing!r}, but this loader "
                              f"appends {_SCRATCH_PARAMS!r} (Triton's scratch pointers): {rebuild}")
    warps, threads = meta.get("num_warps"), meta["threads_per_block"]
    if not isinstance(threads, int) or threads <= 0 or threads % 32 or (warps is not None and threads != 32 * warps):
        raise KernelLoadError(f"kernel metadata {meta_path}: threads_per_block {threads!r} is not 32 * num_warps "
                              f"({warps!r}), the block the kernel was compiled for: {rebuild}")
    if threads > _MAX_THREADS_PER_BLOCK:
        raise KernelLoadError(f"kernel metadata {meta_path}: threads_per_block {threads} (num_warps {warps!r}) is "
                              f"more than the {_MAX_THREADS_PER_BLOCK} threads CUDA launches in a block on any GPU "
                              "(cuLaunchKernel would refuse it at the first token): rebuild the bundle with "
                              "num_warps <= 32 in its tuning")
    if not isinstance(meta["shared_memory_bytes"], int) or meta["shared_memory_bytes"] < 0:
        raise KernelLoadError(f"kernel metadata {meta_path}: shared_memory_bytes {meta['shared_memory_bytes']!r} "
                              f"is not a byte count: {rebuild}")


def _cubin_sm(image: bytes) -> int | None:
    """The SM a cubin's SASS is for, from its ELF header (``e_flags``; LLVM's ``BinaryFormat/ELF.h``: ABI version 7
    keeps it in the low byte (``EF_CUDA_SM``), version 8 in bits 8-15 (``EF_CUDA_SM_MASK``)); None for another ABI
    version. Raises ValueError when the image is not a CUDA ELF (``EM_CUDA`` = 190) at all."""
    import struct

    if len(image) < 52 or image[:4] != b"\x7fELF" or image[4] not in (1, 2):
        raise ValueError("it is not an ELF file")
    flags_at = 48 if image[4] == 2 else 36
    if struct.unpack_from("<H", image, 18)[0] != 190 or len(image) < flags_at + 4:
        raise ValueError("it is an ELF file for another machine than CUDA")
    flags = struct.unpack_from("<I", image, flags_at)[0]
    abi = image[8]
    if abi <= 7:
        return flags & 0xFF
    if abi == 8:
        return (flags >> 8) & 0xFF
    return None


_EIATTR_KPARAM_INFO = 0x17  # an .nv.info record describing one kernel parameter (ordinal, offset, size)
_EIFMT_SVAL = 0x04  # an .nv.info record with a 16-bit size and that many bytes; the other formats take 4 bytes


def _cubin_entry_params(image: bytes, kernel_name: str) -> int | None:
    """How many parameters a cubin's ``kernel_name`` takes: the ``EIATTR_KPARAM_INFO`` records, one per parameter,
    of its ``.nv.info.<kernel_name>`` ELF section (what ``cuobjdump -elf`` lists as its KPARAM_INFO; records are a
    format byte, an attribute byte and a 16-bit value, or for ``EIFMT_SVAL`` a 16-bit size and that many bytes).
    The driver packs as many parameters as this says (CUDA Driver API, ``cuLaunchKernel``: the count comes from the
    image). None when the image has no section headers, no such section or none of those records (nothing to
    compare), or is not a 64-bit ELF laid out so."""
    import struct

    try:
        if image[4] != 2:  # ELFCLASS64: what ptxas writes
            return None
        table = struct.unpack_from("<Q", image, 0x28)[0]  # e_shoff
        entry_size, count, names = struct.unpack_from("<HHH", image, 0x3A)  # e_shentsize, e_shnum, e_shstrndx
        if not table or entry_size < 64 or names >= count:
            return None
        sections = [struct.unpack_from("<IIQQQQ", image, table + i * entry_size) for i in range(count)]
        names_at = sections[names][4]
        wanted = b".nv.info." + kernel_name.encode()
        for name, _type, _flags, _addr, offset, size in sections:
            start = names_at + name
            if image[start:image.index(b"\0", start)] != wanted:
                continue
            data, at, params = image[offset:offset + size], 0, 0
            while at + 4 <= len(data):
                fmt, attr, value = data[at], data[at + 1], struct.unpack_from("<H", data, at + 2)[0]
                params += attr == _EIATTR_KPARAM_INFO
                at += 4 + (value if fmt == _EIFMT_SVAL else 0)
            return params or None
    except (IndexError, ValueError, struct.error):
        return None
    return None


def _ptx_target(image: bytes) -> tuple[int, str] | None:
    """``(90, "a")`` for a PTX module whose ``.target`` directive is ``sm_90a`` (PTX ISA, "Target Directives");
    None when it names no ``sm_NN`` target."""
    import re

    found = re.search(rb"^\s*\.target\s+sm_(\d+)([af]?)\b", image, re.MULTILINE)
    return None if found is None else (int(found.group(1)), found.group(2).decode())


def _ptx_refusal(image: bytes, meta: dict, sm: int, capability: int) -> str | None:
    """Why this GPU's driver cannot JIT the PTX of a variant, or the loader would launch it wrongly; None when
    neither. (1) A ``.target`` other than the metadata's SM: the files were mixed. (2) Arch-specific code
    (``sm_90a``; PTX ISA, "Target Directives": arch-accelerated features are not forward-compatible, so
    ``sm_XYa`` runs only on compute capability X.Y; family-specific ``sm_XYf`` only on X.z, z >= Y) for another
    GPU: Triton compiles every target from sm_90 as ``sm_90a`` (``backends/nvidia/compiler.py``,
    ``sm_arch_from_capability``), so an sm_90 bundle's PTX does not run on a newer GPU. (3) An entry with another
    parameter count than the metadata's parameters and the scratch pointers this loader appends: a kernel compiled
    by a Triton with another launcher ABI (``cuLaunchKernel`` reads as many parameters as the image declares)."""
    from .aot import ptx_entry_params

    target = _ptx_target(image)
    if target is not None:
        target_sm, suffix = target
        if target_sm != sm:
            return (f"holds sm_{target_sm}{suffix} code, but its metadata says sm_{sm}: the bundle's kernel files "
                    "were mixed; copy the whole bundle again or rebuild it")
        if suffix == "a" and capability != target_sm:
            runs_on = f"arch-specific PTX that runs only on sm_{target_sm} GPUs"
        elif suffix == "f" and (capability // 10 != target_sm // 10 or capability < target_sm):
            runs_on = f"family-specific PTX that runs only on sm_{target_sm // 10}x GPUs from sm_{target_sm}"
        else:
            runs_on = None
        if runs_on is not None:
            return (f"is sm_{target_sm}{suffix} code, {runs_on}, and this GPU is sm_{capability}: the driver "
                    "cannot JIT it here; build the bundle for this GPU's target (edgesdk build --target ...)")
    declared = ptx_entry_params(image.decode("utf-8", "replace"), str(meta["kernel_name"]))
    passed = len(meta["params"]) + len(_SCRATCH_PARAMS)  # what LoadedKernel.launch packs
    if declared is not None and declared != passed:
        return (f"declares {declared} kernel parameters for {meta['kernel_name']}, but this loader passes {passed} "
                f"(its {len(meta['params'])} parameters, then Triton's scratch pointers): it was compiled by a "
                f"Triton with another launcher ABI (triton {meta.get('triton_version', 'unknown')}); rebuild the "
                "bundle with this edgesdk and triton==3.9.0")
    return None


# what cuModuleLoadData answers for an image made by a newer toolkit than the driver's (CUDA Driver API, CUresult)
_TOO_NEW_FOR_DRIVER = ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "CUDA_ERROR_INVALID_PTX", "CUDA_ERROR_INVALID_IMAGE",
                       "CUDA_ERROR_NO_BINARY_FOR_GPU")


def _driver_too_old_hint(meta: dict, error: str) -> str:
    """For a driver refusal that an image newer than the driver explains (:data:`_TOO_NEW_FOR_DRIVER`): what the
    image was built with (ptxas release, PTX ISA, triton) and the fix; empty for any other refusal."""
    if not any(code in error for code in _TOO_NEW_FOR_DRIVER):
        return ""
    built = ", ".join(f"{what} {meta[key]}" for key, what in (("ptxas_release", "ptxas"), ("ptx_version", "PTX ISA"),
                                                              ("triton_version", "triton")) if meta.get(key))
    return (f"; the image was built with {built or 'an unrecorded toolkit'}, and a driver older than that CUDA "
            "release refuses it: update the board's NVIDIA driver (on a Jetson, the JetPack / L4T release), or "
            "rebuild the bundle with TRITON_PTXAS_PATH set to the ptxas of the board's CUDA release")


def _has_entry(image: bytes, source: str, kernel_name: str) -> bool:
    """Whether a PTX image declares ``.entry kernel_name`` or a cubin's string table holds the symbol."""
    import re

    name = kernel_name.encode()
    if source == "ptx":
        return re.search(rb"\.entry\s+" + re.escape(name) + rb"\s*\(", image) is not None
    return b"\0" + name + b"\0" in image


def load_compiled(kernel_dir: Path, backend: str | None = None, device: int = 0) -> CompiledKernels:
    """Load every compiled variant of ``kernel_dir`` (a bundle's ``kernels/sm_XX``) onto GPU ``device``.

    Raises :class:`KernelLoadError` when neither cuda-python nor a CUDA torch is there, when the device is older
    than the kernels' SM, when the PTX a newer device would JIT cannot run on it (arch-specific ``sm_90a`` code,
    what Triton writes for every target from sm_90) or was compiled for another launcher ABI (another Triton;
    :func:`_ptx_refusal`), when the cubin, the image this GPU runs when it is the kernels' SM, declares another
    parameter count than the loader packs (another Triton's launcher ABI; :func:`_cubin_entry_params`), when the
    driver refuses an image, and when the directory is damaged: ``index.json`` or
    a variant's metadata missing or not JSON, a listed cubin / PTX missing, a cubin or PTX whose SHA-256 is not
    the one recorded at compile time (``ptx_sha256``: every bsr variant's entry is ``_bsr_matmul_kernel``, so a
    PTX swapped with another variant's, a transposed layout's for a plain one say, passes every other check and
    computes garbage on a newer GPU), metadata for another SM than the index, or an index that lists a
    variant twice (:func:`_check_names_once`). Each names the file and the fix.
    """
    kernel_dir = Path(kernel_dir)
    index_path = kernel_dir / "index.json"
    if not index_path.is_file():
        what = "directory" if not kernel_dir.is_dir() else "index"
        raise KernelLoadError(f"kernel {what} {index_path if what == 'index' else kernel_dir} not found: a compiled "
                              "kernel directory (kernels/sm_XX, written by the build for a GPU target) holds an "
                              "index.json; copy the whole bundle again (edgesdk deploy) or rebuild it")
    index = _read_json(index_path, "kernel index")
    try:
        sm = int(index["sm"])
        entries = list(index["kernels"])
    except (KeyError, TypeError, ValueError) as exc:
        raise KernelLoadError(f"kernel index {index_path} lacks a valid 'sm' or 'kernels' entry ({exc!r}): the "
                              "kernel directory is damaged; copy the whole bundle again or rebuild it") from exc
    named = kernel_dir.resolve().name
    if named.startswith("sm_") and named[3:].isdigit() and int(named[3:]) != sm:
        raise KernelLoadError(f"kernel index {index_path} lists sm_{sm} kernels, but the directory is {named}: the "
                              "bundle's kernel directories were mixed up; copy the whole bundle again or rebuild it")
    _check_names_once(entries, index_path)
    driver = select_driver(backend, device)
    kernels: dict[str, LoadedKernel] = {}
    failed: dict[str, str] = {}
    try:
        _load_variants(kernel_dir, index_path, sm, entries, driver, kernels, failed)
    except BaseException:  # the variants loaded before the one refused, and the driver's context, go now
        with contextlib.suppress(Exception):  # the refusal is the error to report, not a failed unload
            CompiledKernels(sm, kernels, failed, driver.name, driver).close()
        raise
    return CompiledKernels(sm, kernels, failed, driver.name, driver)


def _check_names_once(entries: list, index_path: Path) -> None:
    """Raise KernelLoadError naming a variant that ``index_path`` lists twice, before anything is loaded: the
    loader keeps one module per name, so the second entry's load left the first's module loaded until exit, and
    the compiler writes one ``{name}.cubin`` per name, so the two entries cannot both be what it wrote."""
    # an entry without a name is skipped: _load_variants names it
    twice = first_named_twice(entry.get("name") if isinstance(entry, dict) else None for entry in entries)
    if twice is not None:
        raise KernelLoadError(f"kernel index {index_path} lists the kernel {twice!r} twice: the compiler lists "
                              "each variant once, so the kernel directory is damaged; rebuild the bundle (or "
                              "copy the whole bundle again)")


def first_named_twice(names: Iterable[object]) -> str | None:
    """The first name ``names`` holds twice, for the compiler (edgesdk/kernels/aot.py ``compile_for_target``) and
    the loader (:func:`_check_names_once`) alike: each variant is written to one ``{name}.cubin`` and kept as one
    module by name. Values that are not strings are skipped; None where every name is there once."""
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            continue
        if name in seen:
            return name
        seen.add(name)
    return None


def _load_variants(kernel_dir: Path, index_path: Path, sm: int, entries: list, driver: Any,
                   kernels: dict[str, LoadedKernel], failed: dict[str, str]) -> None:
    """Load the variants ``entries`` of ``index_path`` list through ``driver`` into ``kernels`` (the ones the
    compiler refused into ``failed``), or raise the KernelLoadError :func:`load_compiled` describes."""
    capability = driver.capability()
    if capability < sm:
        raise KernelLoadError(f"the kernels in {kernel_dir} are for sm_{sm}; this GPU is sm_{capability}, older, "
                              f"and cannot run them: build the bundle for this board's target (edgesdk build "
                              f"--target ...)")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise KernelLoadError(f"kernel index {index_path} has an entry {entry!r} without a name: the kernel "
                                  "directory is damaged; copy the whole bundle again or rebuild it")
        if not entry.get("ok", True):
            failed[entry["name"]] = entry.get("error") or "compile failed"
            continue
        meta_path = _inside(kernel_dir, entry.get("meta_path") or f"{entry['name']}.json", "kernel metadata",
                            index_path)
        meta = _read_json(meta_path, "kernel metadata")
        _check_meta(meta, meta_path, sm, index_path)
        if meta["name"] != entry["name"]:
            raise KernelLoadError(f"kernel metadata {meta_path} is for {meta['name']!r}, but {index_path} lists it "
                                  f"as {entry['name']!r}: the directory is damaged; copy the bundle again or rebuild it")
        source = "cubin" if capability == sm else "ptx"
        if not isinstance(meta["files"], dict) or source not in meta["files"]:
            raise KernelLoadError(f"kernel metadata {meta_path} lacks files.{source}: it was not written by this "
                                  "edgesdk's compiler; rebuild the bundle")
        image_path = _inside(kernel_dir, meta["files"][source], source, meta_path)
        try:
            image = image_path.read_bytes()
        except OSError as exc:
            raise KernelLoadError(f"{source} {image_path} of kernel {meta['name']} is not readable ({exc}): copy "
                                  "the whole bundle again (edgesdk deploy) or rebuild it") from exc
        recorded = meta.get(f"{source}_sha256")  # bundles from before ptx_sha256 have only the cubin's
        if recorded and hashlib.sha256(image).hexdigest() != recorded:
            raise KernelLoadError(f"{source} {image_path} does not match the SHA-256 recorded when it was compiled "
                                  f"({str(recorded)[:12]}...): the file was changed or swapped with another "
                                  "variant's; copy the bundle again or rebuild it")
        if source == "cubin":
            try:
                image_sm = _cubin_sm(image)
            except ValueError as exc:
                raise KernelLoadError(f"cubin {image_path} of kernel {meta['name']} is not a CUDA cubin ({exc}): "
                                      "copy the whole bundle again or rebuild it") from exc
            if image_sm is not None and image_sm != sm:
                raise KernelLoadError(f"cubin {image_path} holds sm_{image_sm} code, but {meta_path} and {index_path} "
                                      f"say sm_{sm}: the bundle's kernels were compiled for another target; rebuild "
                                      f"the bundle for this board (edgesdk build --target ...)")
            declared = _cubin_entry_params(image, str(meta["kernel_name"]))
            passed = len(meta["params"]) + len(_SCRATCH_PARAMS)  # what LoadedKernel.launch packs
            if declared is not None and declared != passed:
                raise KernelLoadError(
                    f"cubin {image_path} of kernel {meta['name']} declares {declared} kernel parameters for "
                    f"{meta['kernel_name']}, but this loader passes {passed} (its {len(meta['params'])} parameters, "
                    f"then Triton's scratch pointers): it was compiled by a Triton with another launcher ABI (triton "
                    f"{meta.get('triton_version', 'unknown')}), and the driver would read the missing parameters from "
                    "whatever memory follows; rebuild the bundle with this edgesdk and triton==3.9.0")
        refusal = _ptx_refusal(image, meta, sm, capability) if source == "ptx" else None
        if refusal is not None:
            raise KernelLoadError(f"ptx {image_path} of kernel {meta['name']} {refusal}")
        if not _has_entry(image, source, str(meta["kernel_name"])):
            raise KernelLoadError(f"{source} {image_path} has no kernel named {meta['kernel_name']!r}, the "
                                  f"kernel_name in {meta_path}: the files do not belong together; copy the bundle "
                                  "again or rebuild it")
        try:
            handle = driver.load(image, meta["kernel_name"], int(meta["shared_memory_bytes"]))
        except KernelLoadError as exc:
            raise KernelLoadError(f"{source} {image_path} (kernel {meta['kernel_name']}, "
                                  f"{meta['shared_memory_bytes']} bytes of shared memory) did not load on this "
                                  f"sm_{capability} GPU: {exc}{_driver_too_old_hint(meta, str(exc))}") from exc
        kernels[meta["name"]] = LoadedKernel(meta, driver, handle, source)
