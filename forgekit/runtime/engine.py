"""``Engine``: load a compiled artifact and run it, with neither the TVM compiler nor ``import tvm``.

It loads ``libtvm_runtime.so`` next to ``tvm_ffi`` and drives the Relax VM through its packed functions,
so a deployment needs ``apache-tvm-ffi``, numpy and the runtime library only.  Before any of the
artifact's code runs it checks that this machine can execute it (:mod:`.compat`; for CUDA artifacts the GPU
and its libraries too, :mod:`.device`); inputs are checked against the metadata (:mod:`.inputs`) and copied
into aligned buffers when the kernels need it (:mod:`.loader`), or onto the GPU (:mod:`.transfer`) unless they
are there already.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..artifact.layout import SHARED_WEIGHTS_CHECK, read_metadata, resolve, shared_weights_file
from ..errors import INDEX_ERROR_MARKER, ArtifactError, InputError, UsageError
from .compat import check_runnable, check_size, choose_library
from .device import DL_CPU, Device, ensure_cuda, parse_device
from .inputs import check_inputs, example_inputs
from .integrity import check_files, load_path
from .loader import aligned_copy, ensure_runtime, fit_threads_to_load, runtime_library
from .stats import latency_stats, time_calls
from .transfer import check_device_inputs, hand_over, on_device, synchronizer, to_numpy

_POOLED_ALLOCATOR = 2


class Engine:
    """Load a compiled artifact and run it.

    Parameters
    ----------
    path:
        Artifact directory (with ``model_library.so`` and ``metadata.json``) or a library file.
    key_path, password:
        For encrypted artifacts: the key file (default: ``modelKey.bin`` next to the library) and the
        password (default: ``$FORGEKIT_ENCRYPT_PASSWORD``).  The library is decrypted into an anonymous
        memory file and loaded from there; the plaintext never touches a disk.
    device:
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; default: what the artifact was built for.  A CUDA engine takes
        numpy arrays (copied to the GPU) or DLPack tensors already on its GPU (torch, cupy: no copy), and
        :meth:`infer` returns numpy arrays, or tensors on the GPU with ``as_numpy=False``.
    cuda_graphs:
        A CUDA engine replays each input signature's whole inference as one CUDA graph, captured at its second
        call (:mod:`.cuda_graph`): launch-bound models (batch 1) run at their kernels' speed.  With
        ``as_numpy=False`` a replayed call's outputs are the graph's own buffers, valid until the next call with
        the same input shapes.

    Raises
    ------
    ArtifactError
        Missing or broken artifact; :class:`~forgekit.errors.IncompatibleArtifactError` when it was built
        for another architecture or for CPU features this CPU lacks (checked before any code runs).
    NotAvailableError
        A CUDA artifact where the GPU, its driver or the CUDA runtime library is missing (one line: which).

    An Engine may be shared between threads: its calls run one at a time (TVM's VM is not reentrant).  For
    inferences in parallel, give each thread its own Engine.
    """

    def __init__(self, path: str | os.PathLike[str], key_path: str | None = None, password: str | None = None,
                 device: str | None = None, cuda_graphs: bool = False) -> None:
        self.path = Path(path)
        library, meta_path = resolve(self.path)
        self.metadata: dict[str, Any] = read_metadata(meta_path) if meta_path else {}
        #: where the model runs (``cpu`` or ``cuda:N``)
        self.device: Device = parse_device(device, self.metadata)
        if cuda_graphs and self.device.kind != "cuda":
            raise UsageError(f"CUDA graphs run CUDA artifacts, and this engine runs on {self.device}: leave "
                             "cuda_graphs out, or compile for a CUDA target.")
        check_runnable(self.metadata, library, str(path))
        #: the instruction-set level chosen for this CPU (portable artifacts; None for single-ISA ones)
        library, self.level = choose_library(self.metadata, library, str(path))
        check_size(self.metadata, library)
        self.library_path = library
        ensure_runtime()
        #: the GPU's name (None on the CPU)
        self.device_name = (ensure_cuda(self.metadata, self.device, str(path), runtime_library().parent)
                            if self.device.kind == "cuda" else None)
        from .. import crypto  # only encrypted artifacts need `cryptography`

        self.encrypted = crypto.is_encrypted(library)
        try:
            if self.encrypted:
                try:
                    from ..crypto import core as _  # noqa: F401 - decryption needs `cryptography`; plain artifacts do not
                except ImportError:
                    raise ArtifactError(f"'{library}' is encrypted: decrypting it needs the cryptography package "
                                        "(pip install cryptography, a dependency of forgekit-runtime).") from None
                from .memload import load_encrypted_module

                key_path, password = crypto.artifact_key(library, key_path, password)
                module = load_encrypted_module(library, key_path, password)
            else:
                # what compile wrote, byte for byte (AES-GCM authenticates encrypted ones as they decrypt)
                shared = shared_weights_file(self.metadata) if self.level else None
                check_files(self.metadata, library, [shared] if shared else [])
                module = _load(library, shared)
            if self.level is not None and module.implements_function(SHARED_WEIGHTS_CHECK, True):
                # a portable artifact's shared weights file: mapped and checked now, not at the first inference
                module.get_function(SHARED_WEIGHTS_CHECK, True)()
            self._vm = _start_vm(module, self.device)
            self._main = self._vm["main"]
        except crypto.EncryptionError:
            raise
        except ArtifactError:
            raise
        except Exception as exc:
            raise ArtifactError(f"Cannot load '{library}': {str(exc).strip().splitlines()[0]}") from exc
        self._module = module  # keeps the shared library loaded as long as the VM lives
        self._sync = synchronizer(self.device)
        model = self.metadata.get("model", {})
        self._inputs = model.get("inputs", [])
        #: the (shape, dtype) of each input of the last call that passed :func:`check_inputs`
        self._checked: tuple[Any, ...] | None = None
        self._outputs = model.get("outputs", [])
        # one call at a time: TVM's Relax VM keeps its frames and registers in the VM object, and two threads
        # running it at once got each other's registers ("Check failed: reg < frame->register_file.size()"),
        # wrong outputs, or a segfault
        self._lock = threading.Lock()
        # what the build found (forgekit.backends.cpu.io_buffers): inputs read where they are, and the outputs
        # each call allocates anew, handed over without a copy; older artifacts: aligned copies both ways
        io = (self.metadata.get("build") or {}).get("io") or {}
        self._alignment = 0 if io.get("input_alignment") == "element" else 64
        owned = io.get("owned_outputs") if self.device.kind == "cpu" else None
        self._owned = tuple(bool(flag) for flag in owned) if isinstance(owned, list) else ()
        #: the CUDA graphs (:class:`.cuda_graph.CudaGraphs`: ``captured``, ``declined``), None unless asked for
        self.cuda_graphs = _graphs(self._main, self.device) if cuda_graphs else None

    # ------------------------------------------------------------------ description (from the metadata)
    input_names = property(lambda self: [t["name"] for t in self._inputs], doc="Input names, in order.")
    input_shapes = property(lambda self: [tuple(t["shape"]) for t in self._inputs], doc="Symbolic dims are names.")
    input_dtypes = property(lambda self: [t["dtype"] for t in self._inputs], doc="Input dtypes (numpy names).")
    output_names = property(lambda self: [t["name"] for t in self._outputs], doc="Output names, in order.")
    output_shapes = property(lambda self: [tuple(t["shape"]) for t in self._outputs], doc="Symbolic dims: names.")
    output_dtypes = property(lambda self: [t["dtype"] for t in self._outputs], doc="Output dtypes.")

    # ------------------------------------------------------------------ inference
    def arrange(self, args: tuple[Any, ...]) -> list[Any]:
        """Inputs given positionally or as one ``{name: array}`` dict, checked and aligned, in input order (tensors
        already on this engine's GPU are checked and kept as they are)."""
        if len(args) == 1 and isinstance(args[0], Mapping):
            feeds = dict(args[0])
            unknown = sorted(set(feeds) - set(self.input_names))
            missing = [n for n in self.input_names if n not in feeds]
            if unknown or missing:
                raise InputError(f"Inputs by name must be exactly {self.input_names}; "
                                 f"unknown {unknown}, missing {missing}.")
            arrays = [feeds[n] for n in self.input_names]
        else:
            arrays = list(args)
        ranges = self.metadata.get("model", {}).get("dynamic")
        on_gpu = [self.device.kind != "cpu" and on_device(a, self.device) for a in arrays]
        arrays = [a if gpu else _host_array(a) for a, gpu in zip(arrays, on_gpu)]
        if any(on_gpu):
            return check_device_inputs(self._inputs, arrays, self.device, ranges)
        if self._inputs:
            # the same shapes and dtypes as the last checked call pass again: a streaming model (a wake-word
            # classifier, 0.05 ms of kernels) spent ~10 us per call re-checking them
            seen = tuple((a.shape, a.dtype.str) if isinstance(a, np.ndarray) else None for a in arrays)
            if seen != self._checked or None in seen:
                arrays = check_inputs(self._inputs, arrays, ranges)
                self._checked = None if None in seen else seen
        return [aligned_copy(np.asarray(a), self._alignment) for a in arrays]

    def _arguments(self, inputs: tuple[Any, ...]) -> list[Any]:
        """The VM's arguments: tensors on this engine's device (host arrays copied there)."""
        from .transfer import device_tensor

        return [device_tensor(a, self.device) for a in self.arrange(inputs)]

    def infer(self, *inputs: Any, as_numpy: bool = True) -> list[Any]:
        """Run the model on arrays given positionally or as one ``{name: array}`` dict.

        Returns the outputs as a list of numpy arrays (the caller's own: they stay valid after the next call; an
        output the call allocated is handed over as it is, any other is copied); with ``as_numpy=False``, as
        tensors on the engine's device (DLPack: ``torch.from_dlpack(t)``, no copy).
        """
        if self.cuda_graphs is not None:
            return self._infer_graphed(self.arrange(inputs), as_numpy)
        args = self._arguments(inputs)
        with self._lock:
            outputs = _flatten(_run(self._main, args))
        if not as_numpy:
            return outputs
        owned = self._owned if len(self._owned) == len(outputs) else ()
        return [hand_over(t) if owned and owned[k] else to_numpy(t) for k, t in enumerate(outputs)]

    def _infer_graphed(self, args: list[Any], as_numpy: bool) -> list[Any]:
        from .cuda_graph import fresh_copy

        with self._lock:
            result, replayed = self.cuda_graphs(args)
            outputs = _flatten(result)
            if as_numpy:
                return [to_numpy(t) for t in outputs]
            # a call that ran as usual has its outputs in the pool a graph's intermediates come from
            return outputs if replayed else [fresh_copy(t) for t in outputs]

    def prepared_call(self, *inputs: Any) -> Any:
        """A zero-argument function running the model on ``inputs`` (checked and converted once, on the device
        already) and waiting for the device to finish: what a timer calls, so only the model's time is measured
        (with CUDA graphs: the graph captured now, replayed by each call)."""
        main, sync, lock = self._main, self._sync, self._lock
        if self.cuda_graphs is not None:
            with lock:
                replay = self.cuda_graphs.prepared(self.arrange(inputs))

            def call_graph() -> Any:
                with lock:
                    result = replay()
                    sync()
                return result

            return call_graph
        args = self._arguments(inputs)

        def call() -> Any:
            with lock:
                result = _run(main, args)
                if sync is not None:
                    sync()
            return result

        return call

    def set_instrument(self, instrument: Any) -> None:
        """Call ``instrument(func, symbol, before, result, *args)`` around every kernel and runtime call the
        VM makes (``None`` removes it): what :mod:`forgekit.evaluate.profile` times kernels with."""
        import tvm_ffi

        self._vm["set_instrument"](tvm_ffi.convert(instrument) if instrument is not None else None)

    def warm_up(self, n: int = 1) -> None:
        """Run ``n`` inferences on zero inputs (first runs pay for memory pools and page faults)."""
        feeds = self.example_inputs(random=False)
        for _ in range(n):
            self.infer(*feeds)

    def example_inputs(self, random: bool = True, seed: int = 0) -> list[np.ndarray]:
        """Inputs matching the metadata (a symbolic dim: 1, or the middle of its ``--dynamic`` range): random in
        [0, 1) or zeros."""
        return example_inputs(self._inputs, random=random, seed=seed,
                              ranges=self.metadata.get("model", {}).get("dynamic"))

    def time_runs(self, n: int = 10, warmup: int = 1, inputs: Sequence[np.ndarray] | None = None) -> list[float]:
        """Milliseconds of each of ``n`` runs after ``warmup`` untimed ones (inputs checked and converted once)."""
        if n <= 0:
            raise InputError(f"Benchmark needs at least one run, got n={n}.")
        return time_calls(self.prepared_call(*(list(inputs) if inputs is not None else self.example_inputs())),
                          n, warmup)

    def benchmark(self, n: int = 10, warmup: int = 1, inputs: Sequence[np.ndarray] | None = None) -> dict[str, float]:
        """Time ``n`` runs after ``warmup`` runs; returns milliseconds (median, p90, mean, min) and throughput."""
        return latency_stats(self.time_runs(n, warmup, inputs))


def _graphs(main: Any, device: Device) -> Any:
    from .cuda_graph import CudaGraphs

    return CudaGraphs(lambda args: _run(main, args), device.index)  # _run: its one-line input errors too


def _start_vm(module: Any, device: Device) -> Any:
    """The module's Relax VM, initialized for ``device`` (then the host: shape functions and scalars live
    there); a function the model calls that only TVM's Python package registers is provided first
    (:mod:`.builtins`: NonZero, Unique)."""
    from .builtins import missing_function, provide

    for attempt in (0, 1):
        vm = module["vm_load_executable"]()
        try:
            vm["vm_initialization"](device.dlpack_type, device.index, _POOLED_ALLOCATOR, DL_CPU, 0,
                                    _POOLED_ALLOCATOR)
            return vm
        except Exception as exc:
            name = missing_function(str(exc))
            if attempt or name is None:
                raise
            provide(name)
    raise AssertionError("unreachable")  # pragma: no cover


def _load(library: Path, shared_weights: str | None) -> Any:
    """The library as a module: from its file (:func:`.integrity.load_path`), or from memory when the file
    was overwritten in place since this process loaded it (then a level of a portable artifact, which finds its
    shared weights next to its file, cannot be loaded: one line)."""
    import tvm_ffi

    path = load_path(library)
    if path is not None:
        return tvm_ffi.load_module(path)
    if shared_weights:
        raise ArtifactError(f"'{library}' was overwritten in place after this process loaded it: write the new "
                            "artifact beside it and rename it over the old one (as 'forgekit compile' does), or "
                            "restart the process.")
    from .memload import load_module_from_memory

    return load_module_from_memory(library.read_bytes(), name=library.name)


#: how TVM's VM words a failed run-time shape check (``match_cast``): inside a model, only a shape computed from
#: input values can fail one (the importer checks a data-dependent Reshape's element count that way)
SHAPE_CHECK = "match_cast error"


def _run(main: Any, args: list[Any]) -> Any:
    """``main(*args)``; an index the model's bounds checks refused (:mod:`forgekit.passes.index_checks`) is an
    InputError (exit 9) with the check's own line.  The calling thread's pool first takes as many threads as
    cores are free (:func:`.loader.fit_threads_to_load`: under CPU contention TVM's barriers collapse)."""
    fit_threads_to_load()
    try:
        return main(*args)
    except Exception as exc:
        message = str(exc).strip()
        if message.startswith(INDEX_ERROR_MARKER):
            raise InputError(message.splitlines()[0]) from None
        if SHAPE_CHECK in message:  # a shape computed from input values (a Reshape to them) that the data has not
            counts = re.search(r"\((\d+) vs\. (\d+)\)", message)
            detail = f" (the data has {counts[1]} elements, the values ask for {counts[2]})" if counts else ""
            raise InputError(f"The input values ask for a shape the data does not have{detail}: a Reshape or "
                             "Expand of this model takes its shape from them; check the values of its integer "
                             "inputs.") from None
        raise


def _host_array(value: Any) -> Any:
    """A DLPack tensor in host memory (a tvm_ffi Tensor, a CPU torch tensor) as a numpy view; anything else as
    given (numpy arrays, lists)."""
    if isinstance(value, np.ndarray) or not hasattr(value, "__dlpack__"):
        return value
    try:
        return np.from_dlpack(value)
    except (TypeError, BufferError, RuntimeError) as exc:
        raise InputError(f"A tensor input cannot be read on the host ({exc}): pass a numpy array or a tensor on "
                         "this engine's device.") from None


def _flatten(result: Any) -> list[Any]:
    """The VM's result (a tensor or nested tuples of them) as a flat list of tensors."""
    if hasattr(result, "__dlpack__"):
        return [result]
    return [a for item in result for a in _flatten(item)]
