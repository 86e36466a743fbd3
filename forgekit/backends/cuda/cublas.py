"""Matmuls through NVIDIA's cuBLAS on CUDA targets (``--gpu-kernels vendor``; phase 1 of :mod:`.pipeline`).

Every float matmul cuBLAS computes exactly as the graph does becomes one call into ``ext/forgekit_cublas.cc``,
compiled into the artifact's library as the cuDNN extension is (:func:`with_extension`)::

    matmul(a, b) [-> astype(a.dtype): the fp16 build's fp32 accumulator, rounded once]
      =>  R.call_dps_packed("forgekit_cublas_matmul", (a, b, attrs), out)

The class it covers: ``a`` of rank >= 2 times a 2-D ``b`` (a Linear/Gemm/MatMul layer's weights: ``a``'s leading
dims are one GEMM's rows), or ``a`` and ``b`` of the same rank with the same batch dims (attention's
``q @ k^T`` and ``p @ v``: one strided batched GEMM), static or symbolic; fp32 exact (FMA, no TF32, as
PyTorch with TF32 off) and fp16 with fp32 accumulation on tensor cores.  The epilogue (bias, GELU, residual)
stays Relax for TVM to fuse into one kernel, as with the convolutions.

Why: on an H200, a 4-layer BERT-style encoder at batch 32 in fp32 spent 72 % of its 2.0 ms in TVM's own
matmul kernels (DLight's ``Matmul`` rule: SIMT, ~4 TFLOP/s), 1.22x ``torch.compile``, which calls cuBLAS
(docs/gpu.md, run E).  Why not TVM's ``partition_for_cublas``: its codegen (``relax.ext.cublas``) and runtime
are not in the apache-tvm wheel.  Not measured on a GPU yet, so ``auto`` does not route matmuls: ``vendor``
asks for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .dispatch import cast_patterns, dtype_of, extension_compiler, find_cudart, rewrite_patterns, shape_of

#: the packed function's symbol in the artifact (``__tvm_ffi_`` + this)
FUNCTION = "forgekit_cublas_matmul"
SOURCE = Path(__file__).parent / "ext" / "forgekit_cublas.cc"
#: shared libraries the extension needs at run time (NVIDIA's nvidia-cublas and nvidia-cuda-runtime wheels);
#: libcublas.so.13 loads its libcublasLt.so.13 from its own folder
LIBRARIES = ("libcublas.so.13", "libcudart.so.13")
_FLOATS = ("float32", "float16")


def _same_batch(a: list[Any], b: list[Any]) -> bool:
    """``a`` and ``b`` (shapes) are a weight-like 2-D ``b`` under any ``a``, or equal batch dims (provably)."""
    import tvm

    if len(b) == 2:
        return len(a) >= 2
    if len(a) != len(b):
        return False
    analyzer = tvm.sym.Analyzer()
    return all(analyzer.can_prove_equal(x, y) for x, y in zip(a[:-2], b[:-2]))


def _rewriter(parts: dict[str, Any], single_use: Callable[[Any], bool]) -> Callable[[Any, Any], Any]:
    from tvm import relax

    def rewrite(expr: Any, matched: Any) -> Any:
        matmul, a, b = matched[parts["op"]], matched[parts["a"]], matched[parts["b"]]
        if "cast" in parts and not single_use(matmul):
            return expr  # its fp32 result has another reader: the call would run it a second time
        dtype = dtype_of(a)
        a_shape, b_shape = shape_of(a), shape_of(b)
        if (dtype not in _FLOATS or dtype_of(b) != dtype or dtype_of(expr) != dtype or a_shape is None
                or b_shape is None or not _same_batch(a_shape, b_shape)):
            return expr
        flags = [int(dtype != "float32")]  # math: tensor cores for fp16, FMA (exact) for fp32
        return relax.call_dps_packed(FUNCTION, relax.Tuple([a, b, relax.ShapeExpr(flags)]), out_ty=expr.ty)

    return rewrite


def route_matmuls(mod: Any) -> Any:
    """``mod`` with every matmul cuBLAS computes exactly as one call (see the module docstring)."""
    return rewrite_patterns(mod, cast_patterns("relax.matmul", ("a", "b")), _rewriter)


def route_matmuls_pass() -> Any:
    """:func:`route_matmuls` as a module pass."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="forgekit.CublasMatmuls")
    def route(mod: Any, _ctx: Any) -> Any:
        return route_matmuls(mod)

    return route


def calls_cublas(executable: Any) -> bool:
    """Whether a built Relax executable calls the extension (so its library must carry it)."""
    return FUNCTION in executable.as_text()


def find_cublas() -> tuple[Path, Path] | None:
    """``cublas_v2.h`` and ``libcublas.so.13`` (include, lib) from NVIDIA's ``nvidia-cublas`` wheel or a CUDA
    install; None when either is missing."""
    return find_cudart(("cublas_v2.h",), LIBRARIES)


def with_extension(fcompile: Any) -> Any:
    """``fcompile`` (None: TVM's default g++) also compiling ``ext/forgekit_cublas.cc`` into the library, linked
    against ``libcublas.so.13`` and ``libcudart.so.13`` by soname (:func:`.dispatch.extension_compiler`)."""
    kit = find_cublas()  # NVIDIA's cu13 folder: cuBLAS and the CUDA runtime, headers and libraries
    if kit is None:
        from ...errors import ToolchainError

        raise ToolchainError("Linking cuBLAS calls needs NVIDIA's cuBLAS and CUDA runtime wheels: pip install "
                             "nvidia-cublas nvidia-cuda-runtime, or use --gpu-kernels auto.")
    return extension_compiler(fcompile, SOURCE, [f"-I{kit[0]}", f"-L{kit[1]}"], LIBRARIES)
