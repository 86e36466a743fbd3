"""The TVM runtime library and buffers it can take: what an artifact needs besides itself.

``libtvm_runtime.so`` (3 MiB) next to ``tvm_ffi`` registers the Relax VM loader; nothing here imports
the TVM compiler.  Inputs are copied into 64-byte-aligned buffers: TVM's kernels assume that alignment
and an unaligned buffer crashes the process without a message.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

import numpy as np

from ..errors import ArtifactError

_ALIGN = 64
_RUNTIME_LOADED = False


def runtime_library() -> Path:
    """Path of ``libtvm_runtime.so``: ``FORGEKIT_TVM_RUNTIME``, else the one the ``forgekit-runtime`` wheel
    carries next to this module (runtime/python/build_wheel.py), else the one in the installed tvm wheel."""
    env = os.environ.get("FORGEKIT_TVM_RUNTIME")
    if env:
        return Path(env)
    bundled = Path(__file__).with_name("lib") / "libtvm_runtime.so"
    if bundled.is_file():
        return bundled
    spec = importlib.util.find_spec("tvm")  # locates the package without executing it
    if spec is None or not spec.submodule_search_locations:
        raise ArtifactError("libtvm_runtime.so not found: install apache-tvm or set FORGEKIT_TVM_RUNTIME.")
    return Path(list(spec.submodule_search_locations)[0]) / "lib" / "libtvm_runtime.so"


#: TVM's worker threads spin this many times (each a sched_yield) for the next task before sleeping.  TVM's
#: default, 300000, keeps a core busy for 50-200 ms after every inference: onnxruntime run right after a
#: forgekit SqueezeNet took 15 ms instead of 5 ms, and a deployed app's own threads (an OCR pipeline's Python
#: post-processing between det and rec) pay the same.  The kernels of one inference follow each other within
#: microseconds, so 10000 still bridges them (SqueezeNet: same latency) and the core is free within a few ms.
SPIN_COUNT = "10000"


def default_threads() -> int | None:
    """Threads for TVM's pool when neither ``TVM_NUM_THREADS`` nor ``OMP_NUM_THREADS`` is set: on x86, the
    physical cores.  TVM 0.27 then takes half the logical CPUs, assuming two hyper-threads per core; on this
    2-core Zen 4 VM (one thread per core, like many cloud VMs) that is one thread, and ResNet-50 ran in 35 ms
    instead of 18 (bf16).  Elsewhere TVM's own default (all CPUs) is kept: None."""
    if os.environ.get("TVM_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS"):
        return None
    from .cpu import host_arch, physical_cores

    return physical_cores() if host_arch() == "x86_64" else None


def ensure_runtime() -> None:
    """Load ``libtvm_runtime.so`` (it registers the Relax VM loader) unless TVM already did; a short thread-pool
    spin (:data:`SPIN_COUNT`) unless ``TVM_THREAD_POOL_SPIN_COUNT`` says otherwise, and one thread per physical
    core (:func:`default_threads`) unless ``TVM_NUM_THREADS``/``OMP_NUM_THREADS`` say otherwise."""
    global _RUNTIME_LOADED
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", SPIN_COUNT)  # read when the pool first starts
    threads = default_threads()
    if threads is not None:
        os.environ["TVM_NUM_THREADS"] = str(threads)
    if _RUNTIME_LOADED:
        return
    import tvm_ffi  # loads libtvm_ffi.so, which libtvm_runtime.so links against

    if tvm_ffi.get_global_func("ffi.Module.load_from_bytes.relax.VMExecutable", allow_missing=True) is None:
        library = runtime_library()
        if not library.is_file():
            raise ArtifactError(f"TVM runtime library '{library}' does not exist: install apache-tvm or set "
                                "FORGEKIT_TVM_RUNTIME.")
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    _RUNTIME_LOADED = True


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """``array`` itself when C-contiguous and 64-byte aligned, else an aligned contiguous copy."""
    if array.flags.c_contiguous and array.ctypes.data % _ALIGN == 0:
        return array
    raw = np.empty(array.nbytes + _ALIGN, dtype=np.uint8)
    offset = (-raw.ctypes.data) % _ALIGN
    out = raw[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out
