"""The TVM runtime library and buffers it can take: what an artifact needs besides itself.

``libtvm_runtime.so`` (3 MiB) next to ``tvm_ffi`` registers the Relax VM loader, and
``libtvm_runtime_extra.so`` (1.3 MiB) beside it the library functions some kernels call (``tvm.contrib.sort``:
TopK, Sort, ArgMax's ties; ``tvm.contrib.random``); nothing here imports the TVM compiler.  Inputs are copied
into 64-byte-aligned buffers unless the artifact's kernels take them anywhere (``build.io``): TVM's kernels
assumed that alignment, and an unaligned buffer crashed the process without a message.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from pathlib import Path

import numpy as np

from ..errors import ArtifactError

_ALIGN = 64
_RUNTIME_LOADED = False
#: TVM's runtime library functions outside the VM (sort, topk, random), next to libtvm_runtime.so
EXTRA_LIBRARY = "libtvm_runtime_extra.so"


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


#: TVM binds each pool worker to one core (``TVM_BIND_THREADS`` unset or 1; threading_backend.cc SetAffinity:
#: worker i on core i+1, the calling thread on cores 0..n-1).  A bound worker cannot leave a core that another
#: process keeps busy, and every parallel kernel's barrier waits for it: with two busy processes on this 2-core
#: machine a ResNet-style model took 260-370 ms (median) instead of 6 ms, onnxruntime 55-100 ms (issue 39).
#: onnxruntime does not bind its threads either.
BIND_THREADS = "0"

#: ``FORGEKIT_ADAPTIVE_THREADS=0`` keeps the pool at its configured size under contention.
ADAPTIVE_ENV = "FORGEKIT_ADAPTIVE_THREADS"


def ensure_runtime() -> None:
    """Load ``libtvm_runtime.so`` (it registers the Relax VM loader) unless TVM already did; a short thread-pool
    spin (:data:`SPIN_COUNT`) unless ``TVM_THREAD_POOL_SPIN_COUNT`` says otherwise, unbound workers
    (:data:`BIND_THREADS`) unless ``TVM_BIND_THREADS`` says otherwise, and one thread per physical core
    (:func:`default_threads`) unless ``TVM_NUM_THREADS``/``OMP_NUM_THREADS`` say otherwise."""
    global _RUNTIME_LOADED
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", SPIN_COUNT)  # read when the pool first starts
    os.environ.setdefault("TVM_BIND_THREADS", BIND_THREADS)  # read whenever a pool is (re)configured
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
        # TopK and Sort call tvm.contrib.sort.*, which TVM builds into this second library: without it a TopK
        # artifact loaded but failed at its first call ("Cannot find function tvm.contrib.sort.topk") unless
        # the process had imported tvm
        extra = library.with_name(EXTRA_LIBRARY)
        if extra.is_file():
            ctypes.CDLL(str(extra), mode=ctypes.RTLD_GLOBAL)
    _RUNTIME_LOADED = True


class _LoadProbe:
    """How many threads the pool of the calling thread should use right now (:func:`fit_threads_to_load`)."""

    def __init__(self) -> None:
        self.local = threading.local()  # TVM keeps one pool per calling thread: its size is per thread too
        self.configure = None
        self.fd: int | None = None
        self.enabled = os.environ.get(ADAPTIVE_ENV, "1") != "0"
        self.limit = 1
        self.scale = 1.0
        self.cpus = 1
        if not self.enabled:
            return
        try:
            self.fd = os.open("/proc/loadavg", os.O_RDONLY)
        except OSError:
            self.enabled = False
            return
        ours = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
        self.cpus = len(ours)
        # /proc/loadavg counts the runnable tasks of the whole machine; on a cpuset of it, expect our share
        self.scale = self.cpus / max(os.cpu_count() or self.cpus, self.cpus)
        from .cpu import physical_cores

        self.limit = max(1, _env_threads() or physical_cores())

    def threads(self, current: int) -> int:
        """The pool size for the next inference: the configured size, less one per task that is runnable now on
        this process's CPUs besides the calling thread and its ``current``-thread pool."""
        try:
            running = int(os.pread(self.fd, 128, 0).split()[3].split(b"/")[0])
        except (OSError, ValueError, IndexError):
            return self.limit
        others = max(0.0, (running - current) * self.scale)
        return max(1, min(self.limit, int(self.cpus - others + 0.5)))


def _env_threads() -> int | None:
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return None


_PROBE: _LoadProbe | None = None


def fit_threads_to_load() -> None:
    """Before each CPU inference: size the calling thread's pool to the cores free right now.

    TVM's parallel kernels split their work statically, one chunk per pool thread, and wait for every chunk
    (thread_pool.cc: ``WaitForJobs`` spins on ``sched_yield``).  When other processes keep the cores busy, a
    worker waits for the scheduler for whole time slices at every kernel while the calling thread yields: a
    ResNet-style model under two busy processes took 20-380 ms per inference with 2 threads, 25-44 ms with one,
    onnxruntime (whose threads steal each other's chunks) 55-100 ms (issue 39).  So each inference reads the
    runnable-task count (``/proc/loadavg``, ~2 us) and uses as many threads as cores are free, at least one and at
    most the configured number (``runtime.config_threadpool``, ~3 us, only when the size changes).  Off with
    ``FORGEKIT_ADAPTIVE_THREADS=0`` or where ``/proc/loadavg`` is missing."""
    global _PROBE
    probe = _PROBE
    if probe is None:
        probe = _PROBE = _LoadProbe()
    if not probe.enabled:
        return
    local = probe.local
    current = getattr(local, "threads", probe.limit)
    want = probe.threads(current)
    if want != current or not hasattr(local, "threads"):
        if probe.configure is None:
            import tvm_ffi

            probe.configure = tvm_ffi.get_global_func("runtime.config_threadpool")
        probe.configure(1, want)  # 1: kBig, TVM's default mode; with TVM_BIND_THREADS=0 nothing is bound
        local.threads = want


def pool_threads() -> int | None:
    """The calling thread's pool size as :func:`fit_threads_to_load` last set it (None: not set yet)."""
    return getattr(_PROBE.local, "threads", None) if _PROBE is not None else None


def aligned_copy(array: np.ndarray, alignment: int = _ALIGN) -> np.ndarray:
    """``array`` itself when C-contiguous, writable (DLPack cannot export a read-only array: a memory-mapped
    ``np.load(..., mmap_mode="r")``) and ``alignment``-byte aligned (0: its element's alignment, what the
    kernels of an artifact with ``build.io.input_alignment == "element"`` need), else a 64-byte aligned
    contiguous copy.  A zero-size array gets C strides: numpy gives it zero strides, and the kernels refused
    them ("expected to be compact array")."""
    if array.size == 0:
        strides = [array.itemsize] * array.ndim
        for k in range(array.ndim - 2, -1, -1):
            strides[k] = strides[k + 1] * array.shape[k + 1]
        return np.lib.stride_tricks.as_strided(np.empty(array.shape, array.dtype), strides=strides)
    aligned = array.flags.aligned if alignment == 0 else array.ctypes.data % alignment == 0
    if array.flags.c_contiguous and array.flags.writeable and aligned:
        return array
    raw = np.empty(array.nbytes + _ALIGN, dtype=np.uint8)
    offset = (-raw.ctypes.data) % _ALIGN
    out = raw[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out
