"""CUDA graphs for a CUDA :class:`~forgekit.runtime.Engine` (``Engine(path, cuda_graphs=True)``): the whole
inference, TVM's kernels and the cuDNN calls alike, captured once per input signature and replayed with one
launch.

Why: at batch 1 a model is a hundred short kernels, each launched by the VM from the host, and the GPU waits
for the host between them (MobileNetV2 on an H200: 2.6 ms per inference for ~1 ms of kernels, issue 37).

How (the warm-up-then-capture order of torch's CUDA graph trees): the first call with a new signature (input
shapes and dtypes) runs as usual, the warm-up: cuDNN's ``cudnnFind`` measures its kernels and allocates their
workspace, TVM loads the kernels, the VM's pooled allocator fills.  The second call captures one run on a
private stream and replays it; later calls copy their inputs into the graph's own input buffers and replay.

Why not TVM's ``RewriteCUDAGraph`` (``relax.backend.use_cuda_graph``): it captures at the first call, where
``cudnnFind`` synchronizes and allocates (not allowed inside a capture); it lifts only the static regions
between host work; and it needs a rebuild.  This works on every CUDA artifact as it was built.

Contract:

* the outputs of a replayed call (``as_numpy=False``) are the graph's own buffers, valid until the next call
  with the same signature (copy them to keep them), as with ``torch.cuda.graphs``; the outputs of a call that
  ran as usual are copied out of the pool, since a graph's intermediate buffers come from it;
* a capture that fails (the model synchronizes with the host inside a run, e.g. a shape read from a tensor's
  values) leaves that signature running as usual, with the reason in :attr:`CudaGraphs.declined`;
* at most ``capacity`` graphs are kept (least recently used first out).

Limit: the intermediate buffers of a graph stay in TVM's pooled allocator, which frees its free buffers when an
allocation fails for lack of memory; a graph replayed after that could write into memory given to others.  Keep
the device's memory headroom (one model per process, or a few) when using graphs.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import NotAvailableError

#: cudaStreamCaptureModeRelaxed: the pool may still call cudaMalloc inside a capture (a buffer that the warm-up's
#: outputs, still held by the caller, keep from it); anything that synchronizes with the host still fails it
CAPTURE_RELAXED = 2
#: a blocking stream (not cudaStreamNonBlocking): work that strays onto the legacy default stream during the
#: capture then fails it (cudaErrorStreamCaptureImplicit) instead of running outside the graph unnoticed
STREAM_BLOCKING = 0


class _Cudart:
    """The CUDA runtime calls a capture needs, through ctypes on the libcudart TVM's runtime uses (no CUDA
    Python bindings, torch or cupy needed)."""

    SIGNATURES = {
        "cudaSetDevice": [ctypes.c_int],
        "cudaStreamCreateWithFlags": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint],
        "cudaStreamDestroy": [ctypes.c_void_p],
        "cudaStreamSynchronize": [ctypes.c_void_p],
        "cudaStreamBeginCapture": [ctypes.c_void_p, ctypes.c_int],
        "cudaStreamEndCapture": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)],
        # the *WithFlags spelling: cudaGraphInstantiate changed its signature in CUDA 12, this one did not
        "cudaGraphInstantiateWithFlags": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_ulonglong],
        "cudaGraphLaunch": [ctypes.c_void_p, ctypes.c_void_p],
        "cudaGraphDestroy": [ctypes.c_void_p],
        "cudaGraphExecDestroy": [ctypes.c_void_p],
        "cudaGetLastError": [],
    }

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        for name, argtypes in self.SIGNATURES.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, ctypes.c_int
        lib.cudaGetErrorString.argtypes, lib.cudaGetErrorString.restype = [ctypes.c_int], ctypes.c_char_p

    def status(self, name: str, *args: Any) -> int:
        return int(getattr(self._lib, name)(*args))

    def error(self, status: int) -> str:
        return (self._lib.cudaGetErrorString(status) or b"unknown CUDA error").decode(errors="replace")

    def __call__(self, name: str, *args: Any) -> None:
        status = self.status(name, *args)
        if status:
            raise RuntimeError(f"{name}: {self.error(status)}")


@dataclass
class _Graph:
    inputs: list[Any]  # tvm_ffi tensors on the device, which the graph reads
    result: Any  # the VM's result of the captured run: the buffers the graph writes
    executable: ctypes.c_void_p


def signature(args: Sequence[Any]) -> tuple[tuple[tuple[int, ...], str], ...]:
    """Each argument's shape and dtype (numpy arrays and tvm_ffi tensors alike): what one graph is for."""
    return tuple((tuple(int(d) for d in a.shape), np.dtype(str(a.dtype)).str) for a in args)


class CudaGraphs:
    """One captured graph per input signature of ``run`` (the VM's ``main`` on a list of device tensors)."""

    def __init__(self, run: Callable[[list[Any]], Any], device_index: int, capacity: int = 8) -> None:
        import tvm_ffi

        from .device import loaded_cudart

        lib = loaded_cudart()
        if lib is None:  # Engine loads it (device.ensure_cuda) before it makes one
            raise NotAvailableError("CUDA graphs need the CUDA runtime library loaded: make a CUDA Engine first.")
        self._cuda = _Cudart(lib)
        self._run, self._index, self._capacity = run, device_index, capacity
        self._device = tvm_ffi.device("cuda", device_index)
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self._warm: set[tuple] = set()
        #: the signatures that run as usual, and why their capture failed
        self.declined: dict[tuple, str] = {}

    @property
    def captured(self) -> int:
        return len(self._graphs)

    def __call__(self, args: Sequence[Any]) -> tuple[Any, bool]:
        """``run`` on ``args`` (host arrays or tensors on the device), replayed from a graph where one is or can be
        captured; returns the result and whether it is a graph's own buffers."""
        key = signature(args)
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
            for source, target in zip(args, graph.inputs):
                _copy(source, target)
        elif key in self._warm and key not in self.declined:
            graph = self._capture(key, args)  # with ``args`` copied into its inputs
        if graph is None:
            self._warm.add(key)
            return self._run(self._on_device(args)), False
        self.launch(graph)
        return graph.result, True

    def _on_device(self, args: Sequence[Any]) -> list[Any]:
        from .device import Device
        from .transfer import device_tensor

        return [device_tensor(a, Device("cuda", self._index)) for a in args]

    def prepared(self, args: Sequence[Any]) -> Callable[[], Any]:
        """A zero-argument function replaying the graph of ``args`` (warmed up and captured now, its inputs
        copied once), or running ``args`` as usual where the capture failed."""
        for _ in range(2):
            self(args)
        graph = self._graphs.get(signature(args))
        if graph is None:
            device_args = self._on_device(args)
            return lambda: self._run(device_args)

        def replay() -> Any:
            self.launch(graph)
            return graph.result

        return replay

    def launch(self, graph: _Graph) -> None:
        """Replay ``graph`` on the device's current stream (the legacy default one unless the application set
        one through tvm_ffi): after the inputs' copies, before the outputs' reads, as the kernels ran."""
        import tvm_ffi

        self._cuda("cudaGraphLaunch", graph.executable, ctypes.c_void_p(tvm_ffi.get_raw_stream(self._device) or None))

    def _capture(self, key: tuple, args: Sequence[Any]) -> _Graph | None:
        import tvm_ffi

        cuda = self._cuda
        inputs = [_empty(shape, dtype, self._device) for shape, dtype in key]
        for source, target in zip(args, inputs):
            _copy(source, target)
        stream, graph, executable = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        try:
            cuda("cudaSetDevice", self._index)
            cuda("cudaStreamCreateWithFlags", ctypes.byref(stream), STREAM_BLOCKING)
            cuda("cudaStreamBeginCapture", stream, CAPTURE_RELAXED)
            try:
                with tvm_ffi.use_raw_stream(self._device, stream.value):
                    result = self._run(inputs)
            finally:  # always ends the capture, or the stream stays in it
                ended = cuda.status("cudaStreamEndCapture", stream, ctypes.byref(graph))
            if ended:
                raise RuntimeError(f"cudaStreamEndCapture: {cuda.error(ended)}")
            cuda("cudaGraphInstantiateWithFlags", ctypes.byref(executable), graph, 0)
        except Exception as exc:  # noqa: BLE001 - any failure of the capture: this signature runs as usual
            cuda.status("cudaGetLastError")  # a failed capture's error is not sticky: clear it for the next call
            self.declined[key] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return None
        finally:
            if graph.value:
                cuda.status("cudaGraphDestroy", graph)  # the executable keeps what it needs
            if stream.value:
                cuda.status("cudaStreamDestroy", stream)
        self._graphs[key] = captured = _Graph(inputs, result, executable)
        while len(self._graphs) > self._capacity:
            self._destroy(self._graphs.popitem(last=False)[1])
        return captured

    def _destroy(self, graph: _Graph) -> None:
        import tvm_ffi

        self._cuda.status("cudaStreamSynchronize", ctypes.c_void_p(tvm_ffi.get_raw_stream(self._device) or None))
        self._cuda.status("cudaGraphExecDestroy", graph.executable)

    def close(self) -> None:
        """Destroy every graph (their buffers go with the last reference to them)."""
        while self._graphs:
            self._destroy(self._graphs.popitem()[1])

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the CUDA runtime may be gone already
            pass


def _empty(shape: tuple[int, ...], dtype: str, device: Any) -> Any:
    import tvm_ffi

    return tvm_ffi.get_global_func("runtime.TVMTensorAllocWithScope")(
        tvm_ffi.Shape(shape), tvm_ffi.dtype(str(np.dtype(dtype))), device, None)


def _copy(source: Any, target: Any) -> None:
    """``source`` (a host array or a tensor) into the device tensor ``target``: TVM's copy, on the legacy
    default stream (synchronous from the host), so the graph's launch comes after it."""
    import tvm_ffi

    if source is target:
        return
    tensor = tvm_ffi.from_dlpack(source) if isinstance(source, np.ndarray) else source
    tvm_ffi.get_global_func("runtime.TVMTensorCopyFromTo")(tensor, target)


def fresh_copy(tensor: Any) -> Any:
    """A device tensor copied into a buffer of its own (outside the pool the graphs' intermediates live in)."""
    out = _empty(tuple(int(d) for d in tensor.shape), np.dtype(str(tensor.dtype)).str, tensor.device)
    _copy(tensor, out)
    return out
