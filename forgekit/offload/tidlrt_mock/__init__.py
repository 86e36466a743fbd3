"""The TIDL-RT mock for tests off the board: built from ``tidlrt_mock.c`` with the system C compiler, its
"network" run by onnxruntime (standing in for the C7x/MMA).

:func:`build` compiles the library once per source version into a cache folder; :func:`write_binaries`
writes a subgraph's stand-ins for TI's ``*_tidl_net.bin`` (the subgraph's ONNX bytes) and ``*_tidl_io_1.bin``
(the mock's I/O descriptor); :class:`OnnxruntimeCompute` is the compute function the mock calls on every
``TIDLRT_invoke``: it reads the tensor structs as the glue filled them, runs the subgraph in onnxruntime
and writes the outputs into the caller's buffers, recording every call for tests.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ToolchainError
from ..tidl_rt import ELEMENT_TYPES, SubgraphBinary, TidlrtTensor

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "tidlrt_mock.c", HERE / "tidlrt_mock.h")
IO_MAGIC = b"FKTIDLIO"
_DTYPES = {v: k for k, v in ELEMENT_TYPES.items()}

COMPUTE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                           ctypes.POINTER(ctypes.POINTER(TidlrtTensor)), ctypes.c_int32,
                           ctypes.POINTER(ctypes.POINTER(TidlrtTensor)))


def build(cache: str | os.PathLike[str]) -> Path:
    """``libtidlrt_mock.so`` in ``cache``, compiled with ``cc`` unless this source version is already there."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)).hexdigest()[:12]
    out = Path(cache) / f"libtidlrt_mock-{digest}.so"
    if out.exists():
        return out
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise ToolchainError(f"Building the TIDL-RT mock needs a C compiler ('{compiler}'): apt install gcc.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")  # a concurrent build never sees half a library
    done = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(tmp), str(SOURCES[0])],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise ToolchainError(f"'{compiler}' could not build the TIDL-RT mock: "
                             f"{(done.stderr.strip() or 'no output').splitlines()[0]}")
    tmp.replace(out)
    return out


def write_binaries(sub: Any, directory: str | os.PathLike[str]) -> SubgraphBinary:
    """The mock's files for a :class:`~forgekit.offload.tidl_partition.Subgraph` (named as TI's import names
    its artifacts: ``<name>_tidl_net.bin``, ``<name>_tidl_io_1.bin``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    net, io = directory / f"subgraph_{sub.index}_tidl_net.bin", directory / f"subgraph_{sub.index}_tidl_io_1.bin"
    net.write_bytes(sub.model.SerializeToString())
    io.write_bytes(IO_MAGIC + struct.pack("<ii", len(sub.inputs), len(sub.outputs)))
    return SubgraphBinary(sub.index, net, io, tuple(sub.inputs), tuple(sub.outputs))


def _view(t: TidlrtTensor) -> tuple[str, np.ndarray]:
    """The caller's buffer as numpy, from the struct alone: name, element type, dims, pitches, offset."""
    name = bytes(t.name).split(b"\0", 1)[0].decode()
    dtype = np.dtype(_DTYPES[t.elementType])
    dims = list(t.dimValues)
    shape = dims[len(dims) - t.numDim:]
    if dims[:len(dims) - t.numDim] != [1] * (len(dims) - t.numDim):
        raise ValueError(f"'{name}': dims {dims} with numDim {t.numDim} have non-1 leading dims")
    pitches = [*t.pitch, 1]
    strides = [p * dtype.itemsize for p in pitches][len(dims) - t.numDim:]
    count = int(np.prod(dims[1:])) * dims[0] + t.dataOffset
    base = np.ctypeslib.as_array((ctypes.c_byte * (count * dtype.itemsize)).from_address(t.ptr)).view(dtype)
    view = np.lib.stride_tricks.as_strided(base[t.dataOffset:], shape, strides)
    return name, view


class OnnxruntimeCompute:
    """The mock's network: the net blob is a subgraph's ONNX model, run by onnxruntime on the caller's buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.calls: list[dict[str, Any]] = []  # one per TIDLRT_invoke: inputs' and outputs' names, shapes, dtypes
        self.error: str | None = None  # why the last call failed (the mock only returns -1)
        self._sessions: dict[str, Any] = {}
        self.callback = COMPUTE(self._compute)  # referenced here: ctypes must not free it while C holds it
        lib.tidlrt_mock_set_compute.argtypes = [COMPUTE]
        lib.tidlrt_mock_set_compute(self.callback)

    def _session(self, net: bytes, key: str) -> Any:
        if key not in self._sessions:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.log_severity_level = 3
            self._sessions[key] = ort.InferenceSession(net, options, providers=["CPUExecutionProvider"])
        return self._sessions[key]

    def _compute(self, net: int, net_size: int, n_in: int, ins: Any, n_out: int, outs: Any) -> int:
        try:
            blob = ctypes.string_at(net, net_size)
            key = hashlib.sha256(blob).hexdigest()[:12]
            session = self._session(blob, key)
            feeds = dict(_view(ins[k].contents) for k in range(n_in))
            targets = [_view(outs[k].contents) for k in range(n_out)]
            results = session.run([name for name, _ in targets], {k: np.ascontiguousarray(v) for k, v in feeds.items()})
            for (name, buffer), value in zip(targets, results):
                if value.shape != buffer.shape or value.dtype != buffer.dtype:
                    raise ValueError(f"'{name}' is {value.dtype}{value.shape}, its buffer {buffer.dtype}{buffer.shape}")
                buffer[...] = value
            self.calls.append({"net": key,
                               "inputs": [(k, v.shape, str(v.dtype)) for k, v in feeds.items()],
                               "outputs": [(k, v.shape, str(v.dtype)) for k, v in targets]})
            return 0
        except Exception as exc:  # noqa: BLE001 - an exception must not unwind through C: report it as failure
            self.error = f"{type(exc).__name__}: {exc}"
            return -1
