"""Batched matmuls over a derived dynamic length get that length as a variable of its own (CUDA pipeline, phase 1).

A dynamic length that a strided conv or pool derives from an input dim is an expression in TVM, e.g.
``(width - 5) // 8 + 1`` after a (1, 5) pool of stride 8: an OCR recognizer's sequence (SVTR in PP-OCRv6 rec), a
speech encoder's frames after its subsampling convs.  Self-attention over that length multiplies two tensors in
which the expression is two of the three GEMM extents (``q @ k^T``: M and N; ``p @ v``: M and K).  DLight's GPU
Matmul rule pads both to its tiles, and TVM cannot then prove the tiles' per-thread and shared buffers constant:
the build failed in CUDA codegen ("Can only handle constant size stack allocation for now"), with TVM's kernels
and with cuDNN alike (the matmuls are TVM's either way).  The same matmuls over a plain variable schedule and
build, so each such matmul reads its operands through a ``match_cast`` that names the expression once as a fresh
variable, and its result is cast back to the caller's shape: nothing downstream changes, and the casts only check
at run time what the shapes already say.

Why not TVM's own passes: none rebinds an extent; FuseOps keeps the casts out of kernels (a cast is not a call), so
the matmul loses the fusion of an elementwise epilogue, which a kernel that does not build did not have either.
Matmuls with one expression extent (the projections: M = the length, N and K the channels) build as they are and
are left alone, with their fusion.
"""

from __future__ import annotations

from typing import Any

from ...passes.functions import rewrite_functions

#: GEMM extents (of M, N, K) that must be expressions before a matmul is rewritten: with one it builds
MIN_EXPRESSION_EXTENTS = 2


def _is_expression(dim: Any) -> bool:
    from tvm import tirx

    return not isinstance(dim, (tirx.IntImm, tirx.Var))


def _gemm_extents(call: Any) -> list[Any] | None:
    """M, K and N of ``relax.matmul(a, b)``, or None where an operand's shape is not known or is a vector."""
    a, b = (arg.ty for arg in call.args)
    shapes = [getattr(getattr(t, "shape", None), "values", None) for t in (a, b)]
    if any(s is None or len(s) < 2 for s in shapes):
        return None
    return [shapes[0][-2], shapes[0][-1], shapes[1][-1]]


def plain_gemm_extents_pass() -> Any:
    """The module pass: see the module docstring."""
    import tvm
    from tvm import relax, tirx

    @relax.expr_functor.mutator
    class PlainExtents(relax.PyExprMutator):
        def __init__(self, mod: Any) -> None:
            super().__init__(mod)
            self.named: dict[str, Any] = {}  # one variable per expression within a function

        def plain(self, x: Any) -> Any:
            shape = [self.named.setdefault(str(d), tirx.Var("length", str(d.ty))) if _is_expression(d) else d
                     for d in x.ty.shape.values]
            return self.builder_.match_cast(x, relax.TensorType(shape, x.ty.dtype))

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if getattr(call.op, "name", None) != "relax.matmul":
                return call
            extents = _gemm_extents(call)
            if extents is None or sum(map(_is_expression, extents)) < MIN_EXPRESSION_EXTENTS:
                return call
            a, b = (self.plain(arg) for arg in call.args)
            product = self.builder_.emit(relax.op.matmul(a, b, out_dtype=call.attrs.out_dtype))
            return self.builder_.match_cast(product, call.ty)

    @tvm.transform.module_pass(opt_level=0, name="forgekit.PlainGemmExtents")
    def run(mod: Any, _ctx: Any) -> Any:
        rewriter = PlainExtents(mod)

        def fresh(_gv: Any, _func: Any) -> None:
            rewriter.named = {}

        return rewrite_functions(rewriter, mod, each=fresh, finalize=True)

    return run
