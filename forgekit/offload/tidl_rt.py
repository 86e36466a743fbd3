"""The Arm-side glue of a TIDL-offloaded model: ``forgekit.tidl.subgraph_<i>`` as TIDL-RT calls.

The compiled model calls each offloaded subgraph as ``R.call_dps_packed("forgekit.tidl.subgraph_<i>", ...)``
(:mod:`.tidl_partition`).  :class:`TidlRuntime` creates one TIDL-RT instance per subgraph from its
``*_tidl_net.bin`` / ``*_tidl_io_1.bin`` and registers those names as global packed functions which put the
VM's tensors, in place (no copies), into TIDL-RT tensor structs and call ``TIDLRT_invoke``.  The library is
TI's ``libvx_tidl_rt.so`` on a board (``FORGEKIT_TIDLRT_LIB`` overrides the path) or the mock in
``tidlrt_mock/`` off it.  The structs mirror TI's ``itidl_rt.h`` of PSDK 08.x field for field (see
``tidlrt_mock/tidlrt_mock.h``); the real library has not been run here (no TI board).

Only ``ctypes`` and ``tvm_ffi``: this runs in a deployment without the TVM compiler, next to
:class:`forgekit.runtime.Engine`.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import ArtifactError, InputError

LIBRARY_ENV = "FORGEKIT_TIDLRT_LIB"
DEFAULT_LIBRARY = "libvx_tidl_rt.so"  # TI's TIDL-RT on the board's Linux (PSDK / edgeai images: /usr/lib)
FUNCTION_PREFIX = "forgekit.tidl.subgraph_"

STRING_SIZE, DIM_MAX, PAD_DIM_MAX = 512, 4, 4
#: numpy dtype name -> TIDL-RT element type (TI's numbering)
ELEMENT_TYPES = {"uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "uint32": 4, "int32": 5, "float32": 6,
                 "uint64": 7, "int64": 8}
LAYOUT_NCHW, MEM_USER_SPACE = 0, 0


class TidlrtTensor(ctypes.Structure):
    """TI's ``sTIDLRT_Tensor_t``: one input or output buffer of a TIDL-RT call."""

    _fields_ = [("name", ctypes.c_int8 * STRING_SIZE), ("elementType", ctypes.c_int32), ("numDim", ctypes.c_int32),
                ("dimValues", ctypes.c_int32 * DIM_MAX), ("pitch", ctypes.c_int32 * (DIM_MAX - 1)),
                ("padValues", ctypes.c_int32 * PAD_DIM_MAX), ("ptr", ctypes.c_void_p), ("dataOffset", ctypes.c_int32),
                ("layout", ctypes.c_uint32), ("zeroPoint", ctypes.c_int32), ("scale", ctypes.c_float),
                ("memType", ctypes.c_uint32)]


class TidlrtParams(ctypes.Structure):
    """TI's ``sTIDLRT_Params_t``: the network and I/O descriptor blobs and run options of one instance."""

    _fields_ = [("netPtr", ctypes.c_void_p), ("ioBufDescPtr", ctypes.c_void_p), ("net_capacity", ctypes.c_int32),
                ("io_capacity", ctypes.c_int32), ("flowCtrl", ctypes.c_int32), ("traceLogLevel", ctypes.c_int32),
                ("traceWriteLevel", ctypes.c_int32), ("traceBaseName", ctypes.c_void_p),
                ("quantRangeExpansionFactor", ctypes.c_float), ("quantRangeUpdateFactor", ctypes.c_float),
                ("maxPreEmptDelay", ctypes.c_float), ("TIDLVprintf", ctypes.c_void_p),
                ("TIDLWriteBinToFile", ctypes.c_void_p), ("TIDLReadBinFromFile", ctypes.c_void_p),
                ("stats", ctypes.c_void_p), ("targetPriority", ctypes.c_int32)]


TensorArray = ctypes.POINTER(ctypes.POINTER(TidlrtTensor))
_OWNERS: dict[str, TidlRuntime] = {}  # packed-function name -> the runtime whose function is registered under it


def load_library(path: str | os.PathLike[str] | None = None) -> ctypes.CDLL:
    """TIDL-RT (``path``, else ``$FORGEKIT_TIDLRT_LIB``, else TI's ``libvx_tidl_rt.so``), its calls declared."""
    path = str(path or os.environ.get(LIBRARY_ENV) or DEFAULT_LIBRARY)
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise ArtifactError(f"The TIDL subgraphs cannot run: TIDL-RT library '{path}' does not load "
                            f"({str(exc).splitlines()[0]}); on a TI board it is TI's {DEFAULT_LIBRARY} "
                            f"(set {LIBRARY_ENV} to its path).") from None
    calls = {"TIDLRT_setParamsDefault": [ctypes.POINTER(TidlrtParams)],
             "TIDLRT_setTensorDefault": [ctypes.POINTER(TidlrtTensor)],
             "TIDLRT_create": [ctypes.POINTER(TidlrtParams), ctypes.POINTER(ctypes.c_void_p)],
             "TIDLRT_invoke": [ctypes.c_void_p, TensorArray, TensorArray],
             "TIDLRT_delete": [ctypes.c_void_p]}
    for name, argtypes in calls.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ArtifactError(f"'{path}' has no {name}: it is not a TIDL-RT library.") from None
        fn.argtypes, fn.restype = argtypes, ctypes.c_int32
    return lib


@dataclass(frozen=True)
class SubgraphBinary:
    """One offloaded subgraph as TIDL-RT loads it: TI's compiled network and I/O descriptor files, and the
    ONNX names of its inputs and outputs (TIDL matches buffers to its I/O by name)."""

    index: int
    net: Path
    io: Path
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _why(lib: ctypes.CDLL) -> str:
    """The mock says why a call failed; TI's library logs through its own trace instead."""
    last = getattr(lib, "tidlrt_mock_last_error", None)
    if last is None:
        return ""
    last.restype = ctypes.c_char_p
    return f": {last().decode()}"


def fill_tensor(lib: ctypes.CDLL, t: TidlrtTensor, name: str, shape: Sequence[int], dtype: str, ptr: int) -> None:
    """Describe a dense row-major buffer as TIDL-RT wants it: N, C, H, W with leading 1s, pitches in elements."""
    if dtype not in ELEMENT_TYPES:
        raise InputError(f"TIDL subgraph tensor '{name}' is {dtype}: TIDL-RT takes {', '.join(ELEMENT_TYPES)}.")
    if not 1 <= len(shape) <= DIM_MAX:
        raise InputError(f"TIDL subgraph tensor '{name}' has shape {tuple(shape)}: TIDL-RT tensors have 1-{DIM_MAX} "
                         "dimensions (deny the node that makes it with deny_list:layer_name).")
    lib.TIDLRT_setTensorDefault(ctypes.byref(t))
    raw = name.encode()[:STRING_SIZE - 1]
    ctypes.memmove(t.name, raw, len(raw))
    dims = [1] * (DIM_MAX - len(shape)) + [int(d) for d in shape]
    t.elementType, t.numDim, t.layout, t.memType = ELEMENT_TYPES[dtype], len(shape), LAYOUT_NCHW, MEM_USER_SPACE
    t.dimValues[:] = dims
    t.pitch[:] = [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3]]  # per batch item, channel, line
    t.ptr, t.dataOffset, t.scale, t.zeroPoint = ptr, 0, 1.0, 0  # float in, float out: TIDL quantizes inside


class TidlRuntime:
    """TIDL-RT instances of a model's offloaded subgraphs, callable from the compiled model.

    Create it before the model's VM starts (:class:`forgekit.runtime.Engine` resolves ``forgekit.tidl.*`` when
    it loads) and keep it alive while the model runs; :meth:`close` (or ``with``) deletes the instances.
    """

    def __init__(self, binaries: Sequence[SubgraphBinary], library: str | os.PathLike[str] | None = None) -> None:
        import tvm_ffi

        self.lib = load_library(library)
        self._handles: dict[int, ctypes.c_void_p] = {}
        self._blobs: dict[int, list[Any]] = {}  # TIDL-RT may keep pointing into them: kept with the handle
        try:
            for b in binaries:
                self._handles[b.index] = self._create(b)
        except Exception:
            self.close()
            raise
        for b in binaries:
            tvm_ffi.register_global_func(f"{FUNCTION_PREFIX}{b.index}", self._packed(b), override=True)
            _OWNERS[f"{FUNCTION_PREFIX}{b.index}"] = self

    def _create(self, b: SubgraphBinary) -> ctypes.c_void_p:
        blobs = []
        for path in (b.net, b.io):
            try:
                blobs.append(ctypes.create_string_buffer(Path(path).read_bytes()))
            except OSError as exc:
                raise ArtifactError(f"TIDL subgraph {b.index}: cannot read '{path}' ({exc.strerror}).") from None
        params = TidlrtParams()
        self.lib.TIDLRT_setParamsDefault(ctypes.byref(params))
        params.netPtr, params.net_capacity = ctypes.addressof(blobs[0]), len(blobs[0]) - 1
        params.ioBufDescPtr, params.io_capacity = ctypes.addressof(blobs[1]), len(blobs[1]) - 1
        handle = ctypes.c_void_p()
        self._blobs[b.index] = blobs
        if self.lib.TIDLRT_create(ctypes.byref(params), ctypes.byref(handle)) != 0:
            raise ArtifactError(f"TIDLRT_create failed for subgraph {b.index} ('{b.net}'){_why(self.lib)}.")
        return handle

    def _packed(self, b: SubgraphBinary) -> Any:
        n_in, n_out = len(b.inputs), len(b.outputs)
        ins, outs = (TidlrtTensor * n_in)(), (TidlrtTensor * n_out)()
        in_ptrs = (ctypes.POINTER(TidlrtTensor) * n_in)(*[ctypes.pointer(t) for t in ins])
        out_ptrs = (ctypes.POINTER(TidlrtTensor) * n_out)(*[ctypes.pointer(t) for t in outs])
        lock = threading.Lock()  # the structs are reused, and one TIDL-RT instance runs one call at a time

        def call(*tensors: Any) -> None:
            # destination-passing: the VM hands the inputs, then the outputs it allocated, all on the CPU
            if len(tensors) != n_in + n_out:
                raise InputError(f"TIDL subgraph {b.index} takes {n_in} inputs and {n_out} outputs, "
                                 f"got {len(tensors)} tensors.")
            handle = self._handles.get(b.index)
            if handle is None:
                raise ArtifactError(f"TIDL subgraph {b.index} was closed (TidlRuntime.close) before the model ran.")
            with lock:
                for structs, names, part in ((ins, b.inputs, tensors[:n_in]), (outs, b.outputs, tensors[n_in:])):
                    for t, name, x in zip(structs, names, part):
                        fill_tensor(self.lib, t, name, x.shape, str(x.dtype), x.data_ptr())
                status = self.lib.TIDLRT_invoke(handle, in_ptrs, out_ptrs)
            if status != 0:
                raise ArtifactError(f"TIDLRT_invoke failed for subgraph {b.index}{_why(self.lib)}.")

        return call

    def handle(self, index: int) -> ctypes.c_void_p:
        return self._handles[index]

    def close(self) -> None:
        """Delete the TIDL-RT instances and unregister the functions (a VM that already resolved one gets a
        one-line error from it); a later runtime's registrations of the same names stay."""
        import tvm_ffi

        for name in [name for name, owner in _OWNERS.items() if owner is self]:
            del _OWNERS[name]
            tvm_ffi.remove_global_func(name)
        for index in list(self._handles):
            self.lib.TIDLRT_delete(self._handles.pop(index))

    def __enter__(self) -> TidlRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
