"""A small runtime for forgekit artifacts that needs neither the TVM compiler nor ``import tvm``.

It loads ``libtvm_runtime.so`` (3 MiB) next to ``tvm_ffi`` and drives the Relax VM through its packed
functions, so a deployment image needs ``apache-tvm-ffi``, numpy and the runtime library only.  Inputs
are validated against the artifact's metadata and copied into 64-byte-aligned buffers: TVM's kernels
assume that alignment and an unaligned buffer crashes the process without a message.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import ArtifactError, InputError

_ALIGN = 64
_DLPACK_CPU = 1
_POOLED_ALLOCATOR = 2
_RUNTIME_LOADED = False


def _runtime_library() -> Path:
    """Path of ``libtvm_runtime.so``: ``FORGEKIT_TVM_RUNTIME``, else the one in the installed tvm wheel."""
    env = os.environ.get("FORGEKIT_TVM_RUNTIME")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("tvm")  # locates the package without executing it
    if spec is None or not spec.submodule_search_locations:
        raise ArtifactError("libtvm_runtime.so not found: install apache-tvm or set FORGEKIT_TVM_RUNTIME.")
    return Path(list(spec.submodule_search_locations)[0]) / "lib" / "libtvm_runtime.so"


def ensure_runtime() -> None:
    """Load ``libtvm_runtime.so`` (it registers the Relax VM loader) unless TVM already did."""
    global _RUNTIME_LOADED
    if _RUNTIME_LOADED:
        return
    import tvm_ffi  # loads libtvm_ffi.so, which libtvm_runtime.so links against

    if tvm_ffi.get_global_func("ffi.Module.load_from_bytes.relax.VMExecutable", allow_missing=True) is None:
        library = _runtime_library()
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


def _resolve(path: Path) -> tuple[Path, Path | None]:
    """(library path, metadata path or None) for an artifact directory or a library file."""
    if not path.exists():
        raise ArtifactError(f"Artifact '{path}' does not exist: compile one with 'forgekit compile'.")
    if path.is_dir():
        library = path / "model_library.so"
        if not library.exists():
            raise ArtifactError(f"'{path}' has no model_library.so: is it a forgekit artifact directory?")
        meta = path / "metadata.json"
        return library, meta if meta.exists() else None
    meta = path.parent / "metadata.json"
    return path, meta if meta.exists() else None


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
    """

    def __init__(self, path: str | os.PathLike[str], key_path: str | None = None, password: str | None = None) -> None:
        self.path = Path(path)
        library, meta_path = _resolve(self.path)
        self.library_path = library
        self.metadata: dict[str, Any] = json.loads(meta_path.read_text()) if meta_path else {}
        ensure_runtime()
        import tvm_ffi

        from . import crypto  # noqa: PLC0415 - only encrypted artifacts need `cryptography`

        self.encrypted = crypto.is_encrypted(library)
        if self.encrypted:
            key_path, password = crypto.artifact_key(library, key_path, password)
            module = crypto.load_encrypted_module(library, key_path, password)
        try:
            if not self.encrypted:
                module = tvm_ffi.load_module(str(library))
            self._vm = module["vm_load_executable"]()
            self._vm["vm_initialization"](_DLPACK_CPU, 0, _POOLED_ALLOCATOR, _DLPACK_CPU, 0, _POOLED_ALLOCATOR)
            self._main = self._vm["main"]
        except Exception as exc:
            raise ArtifactError(f"Cannot load '{library}': {str(exc).strip().splitlines()[0]}") from exc
        self._module = module  # keeps the shared library loaded as long as the VM lives
        model = self.metadata.get("model", {})
        self._inputs = model.get("inputs", [])
        self._outputs = model.get("outputs", [])

    # ------------------------------------------------------------------ description
    @property
    def input_names(self) -> list[str]:
        return [t["name"] for t in self._inputs]

    @property
    def input_shapes(self) -> list[tuple[int | str, ...]]:
        return [tuple(t["shape"]) for t in self._inputs]

    @property
    def input_dtypes(self) -> list[str]:
        return [t["dtype"] for t in self._inputs]

    @property
    def output_names(self) -> list[str]:
        return [t["name"] for t in self._outputs]

    @property
    def output_shapes(self) -> list[tuple[int | str, ...]]:
        return [tuple(t["shape"]) for t in self._outputs]

    @property
    def output_dtypes(self) -> list[str]:
        return [t["dtype"] for t in self._outputs]

    # ------------------------------------------------------------------ inference
    def _arrange(self, args: tuple[Any, ...]) -> list[np.ndarray]:
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
        if self._inputs and len(arrays) != len(self._inputs):
            raise InputError(f"The model takes {len(self._inputs)} input(s) {self.input_names}, got {len(arrays)}.")
        checked = []
        for i, array in enumerate(arrays):
            array = np.asarray(array)
            if i < len(self._inputs):
                self._check(self._inputs[i], array)
            checked.append(aligned_copy(array))
        return checked

    @staticmethod
    def _check(spec: Mapping[str, Any], array: np.ndarray) -> None:
        name, shape, dtype = spec["name"], spec["shape"], spec["dtype"]
        if str(array.dtype) != dtype:
            raise InputError(f"Input '{name}' has dtype {array.dtype}; the model expects {dtype}.")
        ok = len(shape) == array.ndim and all(isinstance(d, str) or d == s for d, s in zip(shape, array.shape))
        if not ok:
            expected = "x".join(str(d) for d in shape)
            raise InputError(f"Input '{name}' has shape {'x'.join(map(str, array.shape))}; "
                             f"the model expects {expected}.")

    def infer(self, *inputs: Any) -> list[np.ndarray]:
        """Run the model on arrays given positionally or as one ``{name: array}`` dict.

        Returns the outputs as a list of numpy arrays (copies: they stay valid after the next call).
        """
        import tvm_ffi

        arrays = self._arrange(inputs)
        result = self._main(*[tvm_ffi.from_dlpack(a) for a in arrays])
        return _flatten(result)

    def warm_up(self, n: int = 1) -> None:
        """Run ``n`` inferences on zero inputs (first runs pay for memory pools and page faults)."""
        feeds = self.example_inputs(random=False)
        for _ in range(n):
            self.infer(*feeds)

    def example_inputs(self, random: bool = True, seed: int = 0) -> list[np.ndarray]:
        """Inputs matching the metadata (symbolic dims set to 1): random in [0, 1) or zeros."""
        return example_inputs(self._inputs, random=random, seed=seed)

    def benchmark(self, n: int = 10, warmup: int = 1, inputs: Sequence[np.ndarray] | None = None) -> dict[str, float]:
        """Time ``n`` runs after ``warmup`` runs; returns milliseconds (median, p90, mean, min) and throughput."""
        if n <= 0:
            raise InputError(f"Benchmark needs at least one run, got n={n}.")
        feeds = list(inputs) if inputs is not None else self.example_inputs()
        import tvm_ffi

        arrays = self._arrange(tuple(feeds))
        args = [tvm_ffi.from_dlpack(a) for a in arrays]
        for _ in range(warmup):
            self._main(*args)
        times = []
        for _ in range(n):
            start = time.perf_counter()
            self._main(*args)
            times.append((time.perf_counter() - start) * 1e3)
        times.sort()
        median = statistics.median(times)
        return {"runs": n, "median_ms": median, "p90_ms": times[min(n - 1, int(round(0.9 * (n - 1))))],
                "mean_ms": statistics.fmean(times), "min_ms": times[0],
                "throughput_per_s": 1e3 / median if median > 0 else float("inf")}


def example_inputs(specs: Sequence[Mapping[str, Any]], random: bool = True, seed: int = 0) -> list[np.ndarray]:
    """Inputs for metadata tensor specs (``{"name", "shape", "dtype"}``; symbolic dims set to 1): random
    (floats in [0, 1), 0/1 for masks and booleans, integers in [0, 10)) or zeros.  A function of the
    metadata alone, so inputs can be made for an artifact this machine cannot load."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in specs:
        shape = tuple(d if isinstance(d, int) else 1 for d in spec["shape"])
        dtype = np.dtype(spec["dtype"])
        if not random:
            out.append(np.zeros(shape, dtype))
        elif dtype.kind == "f":
            out.append(rng.random(shape, dtype=np.float32).astype(dtype))
        elif dtype.kind == "b" or "mask" in spec["name"].lower():  # attention masks are 0/1
            out.append(rng.integers(0, 2, shape).astype(dtype))
        else:
            out.append(rng.integers(0, 10, shape).astype(dtype))
    return out


def _flatten(result: Any) -> list[np.ndarray]:
    if hasattr(result, "__dlpack__"):
        return [np.from_dlpack(result).copy()]
    return [a for item in result for a in _flatten(item)]
