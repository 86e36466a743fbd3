"""ONNX Einsum of two operands that is a (batched) matrix product, as ``permute_dims``/``reshape`` + ``matmul``.

TVM's converter emits ``topi.einsum`` as one opaque ``call_tir``: no matmul rule, layout pass, quantizer or
bf16 legalization ever sees it, and it runs on TVM's generic loop nest.  A GRU speech decoder's output
projection ``tbh,hk->tbk`` ([300, 1, 128] x [128, 257]) took 2.16 ms there, against 0.15 ms in onnxruntime
(which also computes Einsum as transposes and a batched GEMM), and made the model 1.55x onnxruntime.

Covered: two operands, explicit ``->`` output, no ellipsis, no letter twice in one operand (a diagonal), every
letter of an operand either in the other operand or in the output (no sum over a letter of one operand alone).
Letters are sorted into batch (both operands and the output), contracted (both operands only), and the free
letters of each side; the left operand becomes ``[batch..., M, K]``, the right ``[batch..., K, N]``, and the
product is reshaped and permuted to the output's order.  Anything else keeps TVM's converter.

Why not onnxscript's or onnx's own decomposition: onnx has no Einsum function body (no
``FunctionProto`` to expand), and onnxruntime's ``EinsumComputePreprocessor`` is C++ inside its kernel.
"""

from __future__ import annotations

from typing import Any

from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe


def _plan(equation: str) -> tuple[str, str, str] | None:
    """(left, right, output) letters of a two-operand equation this module covers, or None."""
    eq = equation.replace(" ", "")
    if "." in eq or "->" not in eq:
        return None
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        return None
    a, b = terms
    if any(len(set(t)) != len(t) for t in (a, b, out)) or not set(out) <= set(a) | set(b):
        return None
    if any(c not in b and c not in out for c in a) or any(c not in a and c not in out for c in b):
        return None  # a letter summed within one operand
    return a, b, out


def _permute(bb: Any, x: Any, letters: str, order: str) -> Any:
    if letters == order:
        return x
    return bb.emit(relax.op.permute_dims(x, [letters.index(c) for c in order]))


def _product(dims: list[Any]) -> Any:
    out: Any = 1
    for d in dims:
        out = d if isinstance(out, int) and out == 1 else out * d
    return out


def _reshape(bb: Any, x: Any, shape: list[Any]) -> Any:
    current = list(x.ty.shape.values)
    if len(current) == len(shape) and all(str(c) == str(s) for c, s in zip(current, shape)):
        return x
    return bb.emit(relax.op.reshape(x, shape))


def emit(bb: Any, equation: str, x: Any, y: Any) -> Any | None:
    """The product of ``x`` and ``y`` as ``equation`` says, through ``matmul``; None when not covered."""
    plan = _plan(equation)
    shapes = [getattr(getattr(t, "ty", None), "shape", None) for t in (x, y)]
    dtypes = {str(getattr(getattr(t, "ty", None), "dtype", "")) for t in (x, y)}
    if plan is None or any(s is None or not hasattr(s, "values") for s in shapes) or len(dtypes) != 1 \
            or not dtypes.pop().startswith(("float", "bfloat")):
        return None
    a, b, out = plan
    if len(shapes[0].values) != len(a) or len(shapes[1].values) != len(b):
        return None
    dim = {**{c: d for c, d in zip(b, shapes[1].values)}, **{c: d for c, d in zip(a, shapes[0].values)}}
    batch = "".join(c for c in out if c in a and c in b)
    k = "".join(c for c in a if c in b and c not in out)
    m = "".join(c for c in out if c in a and c not in b)
    n = "".join(c for c in out if c in b and c not in a)
    for c in batch + k:  # broadcast letters (1 against n) are left to TVM's converter
        if str(shapes[0].values[a.index(c)]) != str(shapes[1].values[b.index(c)]):
            return None
    lhs = _permute(bb, x, a, batch + m + k)
    rhs = _permute(bb, y, b, batch + k + n)
    bdims = [dim[c] for c in batch]
    lhs = _reshape(bb, lhs, bdims + [_product([dim[c] for c in m]), _product([dim[c] for c in k])])
    rhs = _reshape(bb, rhs, bdims + [_product([dim[c] for c in k]), _product([dim[c] for c in n])])
    prod = bb.emit(relax.op.matmul(lhs, rhs))
    prod = _reshape(bb, prod, bdims + [dim[c] for c in m + n])
    return _permute(bb, prod, batch + m + n, out)


class Einsum(_fe.Einsum):
    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        equation = attr["equation"].decode("utf-8") if isinstance(attr["equation"], bytes) else attr["equation"]
        if len(inputs) == 2:
            result = emit(bb, equation, inputs[0], inputs[1])
            if result is not None:
                return result
        return super()._impl_v12(bb, inputs, attr, params)


CONVERTERS = {"Einsum": Einsum}
