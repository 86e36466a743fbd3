"""Tensors in and out of an Engine's device: host arrays copied to the GPU, DLPack tensors already there taken
as they are (no copy), outputs copied back for numpy, and a wait for the GPU for timers.

TVM's runtime does the copies (``runtime.TVMTensorCopyFromTo``: a synchronous ``cudaMemcpy`` for host<->GPU)
and allocations (``runtime.TVMTensorAllocWithScope``), so nothing here needs CUDA's Python bindings, torch or
cupy.  TVM's kernels run on the current stream of the device (the legacy default stream unless an
application sets one), which is what ``synchronizer`` waits for.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import InputError
from .device import DL_CPU, Device
from .inputs import check_inputs, fmt_shape


def on_device(value: Any, device: Device) -> bool:
    """Whether ``value`` is a DLPack tensor on ``device`` (a torch/cupy tensor on that GPU, a tvm_ffi Tensor)."""
    probe = getattr(value, "__dlpack_device__", None)
    if probe is None or isinstance(value, np.ndarray):
        return False
    try:
        kind, index = probe()
    except Exception:  # noqa: BLE001 - not a tensor after all: treated as a host array
        return False
    return int(kind) == device.dlpack_type and int(index) == device.index


class _Described:
    """What :func:`check_inputs` reads of an array (dtype, shape, ndim), for a tensor numpy cannot view."""

    def __init__(self, tensor: Any) -> None:
        self.dtype = np.dtype(str(tensor.dtype))
        self.shape = tuple(int(d) for d in tensor.shape)
        self.ndim = len(self.shape)


def check_device_inputs(specs: Sequence[Mapping[str, Any]], arrays: Sequence[Any], device: Device,
                        ranges: Mapping[str, Mapping[str, Any]] | None) -> list[Any]:
    """Inputs where some are tensors on ``device``: those are checked by dtype and shape (their values stay on
    the GPU: index inputs are bounds-checked by the model itself) and kept; host arrays as for the CPU."""
    import tvm_ffi

    tensors = [tvm_ffi.from_dlpack(a) if on_device(a, device) else None for a in arrays]
    for tensor in tensors:
        if tensor is not None and not tensor.is_contiguous():
            raise InputError(f"A tensor on {device} with shape {fmt_shape(tensor.shape)} is not contiguous: pass "
                             "tensor.contiguous().")
    if specs:
        described = [_Described(t) if t is not None else np.asarray(a) for t, a in zip(tensors, arrays)]
        checked = check_inputs(specs, described, ranges)
        arrays = [t if t is not None else c for t, c in zip(tensors, checked)]
    from .loader import aligned_copy

    return [a if t is not None else aligned_copy(np.asarray(a)) for t, a in zip(tensors, arrays)]


def device_tensor(value: Any, device: Device) -> Any:
    """``value`` (a numpy array, or a tensor already on ``device``) as a tvm_ffi Tensor there: a view of a host
    array on the CPU, a copy on a GPU, the tensor itself when it is there already."""
    import tvm_ffi

    if not isinstance(value, np.ndarray):  # Engine.arrange left only tensors already on ``device`` unconverted
        return tvm_ffi.from_dlpack(value)
    host = tvm_ffi.from_dlpack(value)
    if device.kind == "cpu":
        return host
    out = tvm_ffi.get_global_func("runtime.TVMTensorAllocWithScope")(
        tvm_ffi.Shape(value.shape), tvm_ffi.dtype(str(value.dtype)), tvm_ffi.device(device.kind, device.index), None)
    tvm_ffi.get_global_func("runtime.TVMTensorCopyFromTo")(host, out)
    return out


def hand_over(tensor: Any) -> np.ndarray:
    """An output tensor in host memory that nothing else refers to, as a numpy array without a copy; a copy
    where numpy imports DLPack read-only (numpy < 2.2.5, or an unversioned capsule: numpy#28599), so the
    caller may always write to what :meth:`~forgekit.runtime.Engine.infer` returns."""
    array = np.from_dlpack(tensor)
    return array if array.flags.writeable else array.copy()


def to_numpy(tensor: Any) -> np.ndarray:
    """A host copy of an output tensor (it stays valid after the next inference)."""
    import tvm_ffi

    if tensor.device.dlpack_device_type() == DL_CPU:
        return np.from_dlpack(tensor).copy()
    out = np.empty(tuple(int(d) for d in tensor.shape), dtype=np.dtype(str(tensor.dtype)))
    if out.size:
        tvm_ffi.get_global_func("runtime.TVMTensorCopyFromTo")(tensor, tvm_ffi.from_dlpack(out))
    return out


def synchronizer(device: Device) -> Callable[[], None] | None:
    """A function that waits until ``device`` has finished the work queued on its current stream (None on the
    CPU: its kernels return when done)."""
    if device.kind == "cpu":
        return None
    import tvm_ffi

    sync = tvm_ffi.get_global_func("runtime.Device_StreamSync")
    dev = tvm_ffi.device(device.kind, device.index)
    return lambda: sync(dev, 0)  # 0: the default stream, the one TVM launches on
