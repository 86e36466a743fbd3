"""Weights the runtime never copies: read-only data of the model library, served by a function in it.

A Relax VM executable keeps its constants in a pool that ``libtvm_runtime`` deserializes at load time: the
library's embedded blob is read into a ``std::string``, copied into ``ffi::Bytes``, and every constant is
copied again into a fresh tensor, while the ``.so`` pages it was read from stay resident.  Four copies of the
weights at once: ResNet-50 (100 MB of weights) peaked at 443 MB against onnxruntime's 318 MB, the 20 MB
BERT-style encoder at 133 MB against 96 MB.

Here the large constants of the artifact's ``main`` are lifted out of the executable before VM codegen: each
becomes ``R.call_pure_packed("forgekit_weight", i)``, and the model library gets a small C function of
that name (TVM-FFI's ``__tvm_ffi_<name>`` calling convention, found by the VM among the library's
symbols like any kernel) returning a tensor that *points into* the library's read-only data, where the
packed weights are stored 64-byte aligned (``.incbin``).  No copy is ever made: the weights are the
library's file-backed pages (for an encrypted artifact, the pages of its decrypted memory file), loaded
once, shared by every engine of the same file.  The tensor objects are created on the first call and
cached, so a call costs a reference-count increment (about 0.1 us; ResNet-50 makes 161 per inference).
Nothing changes for the runtimes: Engine, the C API, ``forgekit-run``, RPC devices and the cross builds load
the same single ``.so``.

Why not TVM's own mechanisms: TVM 0.27 dropped ``link-params``/``AllocateConst`` (weights as kernel-local
constants), and passing the weights as ``main`` parameters would make every runtime (Python, C API, RPC)
load and pass a separate weights file.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .shared_weights import SharedWeights

#: the packed function the library exports and the lifted constants call
FUNCTION = "forgekit_weight"
#: constants below this stay in the executable: biases and scalars cost nothing to copy, and each lifted
#: constant is one call per inference
MIN_BYTES = 4096
ALIGN = 64  # TVM's kernels assume (and vector-load with) 64-byte aligned buffers

_DTYPE_CODES = {"i": 0, "u": 1, "f": 2}  # DLPack: kDLInt, kDLUInt, kDLFloat


class WeightStore:
    """The constants lifted from one executable, in call-index order (one store per instruction-set level)."""

    def __init__(self, min_bytes: int = MIN_BYTES) -> None:
        self.min_bytes = min_bytes
        self.arrays: list[np.ndarray] = []

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def lift_pass(self) -> Any:
        """A Relax module pass replacing every constant of at least ``min_bytes`` by a ``forgekit_weight`` call."""
        import tvm

        store = self

        @tvm.transform.module_pass(opt_level=0, name="forgekit.LiftWeights")
        def _lift(mod: Any, _ctx: Any) -> Any:
            # main only: a loop body would call forgekit_weight on every iteration (a GRU's 300 frames: ~0.7 ms
            # of its 1.7 ms), and an offloaded (BYOC) function's constants belong to its external codegen
            if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
                return mod
            mod = mod.clone()
            mod["main"] = _lifter_class()(store, mod).visit_expr(mod["main"])
            return mod

        return _lift

    def sources(self, directory: Path, arch: str, shared: SharedWeights | None = None) -> list[str]:
        """Write ``weights.bin`` (the arrays, each 64-byte aligned), the assembly that embeds it and the C
        function that serves it into ``directory``; returns the two source files to compile into the library.
        ``shared``: the arrays it holds are served from its file next to the library instead (the levels of a
        portable artifact, :mod:`.shared_weights`)."""
        blob = directory / "forgekit_weights.bin"
        entries, shapes, offset = [], [], 0
        with open(blob, "wb") as out:
            for array in self.arrays:
                data = np.ascontiguousarray(array)
                code = _DTYPE_CODES[data.dtype.kind]
                at = shared.offset_of(data) if shared is not None else None
                if at is None:
                    pad = -offset % ALIGN
                    out.write(b"\0" * pad)
                    offset += pad
                    out.write(data.tobytes())
                    at, where = offset, 0
                    offset += data.nbytes
                else:
                    where = 1
                entries.append(f"{{{at}u, {data.ndim}, {len(shapes)}, {code}, {data.dtype.itemsize * 8}, {where}}}")
                shapes += list(data.shape) or [1]
        comment = "@" if arch.startswith(("x86", "i686", "amd64")) else "%"
        asm = directory / "forgekit_weights.S"
        asm.write_text(
            '\t.section .rodata.forgekit_weights,"a"\n\t.balign 64\n\t.globl forgekit_weights_blob\n'
            "\t.hidden forgekit_weights_blob\nforgekit_weights_blob:\n"
            f'\t.incbin "{blob}"\n\t.section .note.GNU-stack,"",{comment}progbits\n')
        source = directory / "forgekit_weights.c"
        text = _C_SOURCE.format(n=len(self.arrays), entries=",\n  ".join(entries),
                                shapes=", ".join(f"{s}LL" for s in shapes) or "0")
        if shared is not None and shared.used_by(self):
            text = shared.c_prelude() + text
        source.write_text(text)
        return [str(source), str(asm)]


def content_key(array: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    """What makes two arrays the same weight: dtype, shape and the sha256 of their bytes."""
    data = np.ascontiguousarray(array)
    return data.dtype.str, tuple(data.shape), hashlib.sha256(memoryview(data).cast("B")).digest()


def _lifter_class() -> type:
    """The mutator, defined on first use (importing ``tvm.relax`` at module import would load TVM)."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Lifter(PyExprMutator):
        def __init__(self, store: WeightStore, mod: Any) -> None:
            super().__init__(mod)
            self.store = store
            self.index: dict[Any, int] = {}
            self.by_content: dict[tuple[str, tuple[int, ...], bytes], int] = {}

        def visit_generic_const_(self, const: Any) -> Any:
            value = const.value
            if not hasattr(value, "numpy"):
                return const
            ty = const.ty
            dtype = np.dtype(str(ty.dtype)) if str(ty.dtype) in ("float32", "float16", "int8", "uint8", "int32",
                                                                   "int64", "uint16", "int16", "float64") else None
            if dtype is None or dtype.itemsize * int(np.prod([int(d) for d in ty.shape.values])) < self.store.min_bytes:
                return const
            # one entry per distinct content, not per constant object: legalization packs (and FoldConstant
            # folds) a weight once per use, so each call site of a shared initializer holds its own object
            # with the same bytes.  Keyed by object, a 256x256 weight used by 8 MatMuls made a 2.1 MB -t host
            # library instead of 0.29 MB, and an unrolled-BiLSTM CRNN 275 MB instead of 22 (issue 39.6)
            seen = const.__hash__()
            if seen not in self.index:
                array = value.numpy()
                key = content_key(array)
                if key not in self.by_content:
                    self.by_content[key] = len(self.store.arrays)
                    self.store.arrays.append(array)
                self.index[seen] = self.by_content[key]
            return relax.op.call_pure_packed(FUNCTION, relax.prim_value(self.index[seen]), ty_args=ty)

    return _Lifter


#: how the generated sources are compiled, for every target family.  ``-ffreestanding``: the C needs only
#: fixed-width integer types (its own and those of TVM-FFI's ``c_api.h``/``dlpack.h``, which include
#: ``<stdint.h>``/``<stddef.h>``), and a freestanding compile takes them from the compiler's own headers.  A
#: hosted compile goes on to the C library's: Android linked by Debian's clang without the NDK has none
#: (clang's ``stdint.h`` reached glibc's ``/usr/include/stdint.h``, then failed on
#: ``bits/libc-header-start.h``: every android/ model with weights failed to link, exit 6).  The shared
#: weights' prelude (:mod:`.shared_weights`) declares the few C library calls it makes instead of including
#: their headers, so it too compiles for any family.
SOURCE_FLAGS = ("-ffreestanding", "-O2")


def with_sources(fcompile: Any, sources: list[str]) -> Any:
    """``fcompile`` (None: TVM's default g++ ``create_shared``) compiling ``sources`` into the library too, with
    TVM-FFI's C headers on the include path; keeps the attributes ``export_library`` reads from it."""
    import tvm_ffi
    from tvm.support import cc

    include = Path(tvm_ffi.__file__).parent / "include"
    base = fcompile or cc.create_shared

    def compile_with_sources(output: str, objects: list[str], options: list[str] | None = None, **kwargs: Any) -> Any:
        return base(output, [*objects, *sources], options=[*(options or []), f"-I{include}", *SOURCE_FLAGS],
                    **kwargs)

    for attr in ("output_format", "get_target_triple", "object_format"):
        if hasattr(base, attr):
            setattr(compile_with_sources, attr, getattr(base, attr))
    return compile_with_sources


def scratch_dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="forgekit-weights-")


_C_SOURCE = """/* Generated by forgekit (forgekit/backends/cpu/weights.py): serves the model's weights from this
   library's read-only data, without copying them. Compiled as C or C++, freestanding (SOURCE_FLAGS): no C
   library headers, only the compiler's own stdint.h (through TVM-FFI's c_api.h). */
#include <tvm/ffi/c_api.h>

#ifndef FK_SHARED
/* no weights shared with other levels: every entry is in this library's own blob */
static const char* fk_shared(void) {{
  TVMFFIErrorSetRaisedFromCStr("RuntimeError", "forgekit_weight: this model library shares no weights");
  return NULL;
}}
#endif

#ifdef __cplusplus
extern "C" {{
#endif

extern const char forgekit_weights_blob[];

struct fk_entry {{
  uint64_t offset;
  int32_t ndim;
  int32_t shape_at;
  uint8_t code;
  uint8_t bits;
  uint8_t where; /* 0: this library's blob; 1: the shared weights file (fk_shared) */
}};

static const struct fk_entry fk_table[{n}] = {{
  {entries}
}};
static int64_t fk_shapes[] = {{{shapes}}};
static DLManagedTensor fk_managed[{n}];
static void* fk_handles[{n}];

__attribute__((visibility("default"))) int __tvm_ffi_forgekit_weight(void* self, const TVMFFIAny* args,
                                                                      int32_t num_args, TVMFFIAny* result) {{
  (void)self;
  if (num_args != 1 || args[0].type_index != kTVMFFIInt || args[0].v_int64 < 0 || args[0].v_int64 >= {n}) {{
    TVMFFIErrorSetRaisedFromCStr("IndexError", "forgekit_weight: no such weight in this model library");
    return -1;
  }}
  int64_t i = args[0].v_int64;
  void* handle = __atomic_load_n(&fk_handles[i], __ATOMIC_ACQUIRE);
  if (handle == NULL) {{
    /* first use: a tensor over the embedded bytes; racing threads write identical fields */
    DLManagedTensor* m = &fk_managed[i];
    const struct fk_entry* e = &fk_table[i];
    const char* base = forgekit_weights_blob;
    if (e->where) {{
      base = fk_shared();
      if (base == NULL) return -1;
    }}
    m->dl_tensor.data = (void*)(base + e->offset);
    m->dl_tensor.device.device_type = kDLCPU;
    m->dl_tensor.device.device_id = 0;
    m->dl_tensor.ndim = e->ndim;
    m->dl_tensor.dtype.code = e->code;
    m->dl_tensor.dtype.bits = e->bits;
    m->dl_tensor.dtype.lanes = 1;
    m->dl_tensor.shape = fk_shapes + e->shape_at;
    m->dl_tensor.strides = NULL;
    m->dl_tensor.byte_offset = 0;
    m->manager_ctx = NULL;
    m->deleter = NULL; /* the data is the library's: nothing to free */
    void* created = NULL;
    if (TVMFFITensorFromDLPack(m, 64, 1, &created) != 0) return -1;
    void* expected = NULL;
    if (__atomic_compare_exchange_n(&fk_handles[i], &expected, created, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {{
      handle = created;
    }} else {{
      TVMFFIObjectDecRef(created);
      handle = expected;
    }}
  }}
  TVMFFIObjectIncRef(handle); /* the caller's reference; the cache keeps its own */
  result->type_index = kTVMFFITensor;
  result->zero_padding = 0;
  result->v_int64 = 0;
  result->v_obj = (TVMFFIObject*)handle;
  return 0;
}}

#ifdef __cplusplus
}}
#endif
"""
