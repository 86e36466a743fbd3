"""Finding the quantizable operators of a Relax ``main`` and exposing intermediate tensors.

A *quantizable op* is a ``conv2d``, ``conv1d`` or ``matmul`` whose second operand (the weight) is a constant.  They
are numbered in binding order; the same numbering is used by calibration (which records the statistics
of each op's data input), by the rewrite and by the accuracy report, so keep every walk here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: convolutions the rewrite quantizes, with the channels-first layouts (data, kernel) it takes.  A 1-D conv
#: stays a conv1d in the quantized module: the CPU pipeline runs it as an integer conv2d of height 1
#: (:mod:`forgekit.passes.conv1d`), so it reaches the same dot-product kernels.  conv3d is left out: no
#: pass turns it into a conv2d, so an int8 conv3d would run generic integer code, not the int8 kernels.
CONV_LAYOUTS = {"relax.nn.conv2d": ("NCHW", "OIHW"), "relax.nn.conv1d": ("NCW", "OIW")}
QUANTIZABLE_OPS = (*CONV_LAYOUTS, "relax.matmul")


@dataclass(frozen=True)
class QuantOp:
    """One quantizable operator: its position, kind and the shapes that matter for the report."""

    index: int
    op: str
    name: str
    weight_shape: tuple[int, ...]


def _is_const(expr: Any) -> bool:
    from tvm.ir.expr import Constant

    return isinstance(expr, Constant)


def is_conv(call: Any) -> bool:
    """Whether the quantizable op ``call`` is a convolution (weights ``[O, I/groups, *kernel]``)."""
    return call.op.name in CONV_LAYOUTS


def is_quantizable(call: Any) -> bool:
    """Whether ``call`` is a float conv2d (NCHW/OIHW), conv1d (NCW/OIW) or matmul with a 2-D constant weight."""
    import tvm
    from tvm import relax

    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return False
    name = call.op.name
    if name not in QUANTIZABLE_OPS or len(call.args) != 2 or not _is_const(call.args[1]):
        return False
    if str(call.args[0].ty.dtype) != "float32" or str(call.args[1].ty.dtype) != "float32":
        return False
    if name in CONV_LAYOUTS:
        a = call.attrs
        data, kernel = CONV_LAYOUTS[name]
        # the rewrite emits the integer conv with default layouts: the output must be channels-first too
        return a.data_layout == data and a.kernel_layout == kernel and (a.out_layout or data) == data
    return len(call.args[1].ty.shape.values) == 2


def bindings(func: Any) -> list[Any]:
    """Every binding of ``func``'s body in execution order."""
    return [b for block in func.body.blocks for b in block.bindings]


def quantizable(func: Any) -> list[tuple[Any, Any]]:
    """(binding, call) of every quantizable op of ``func``, in binding order."""
    from tvm import relax

    return [(b, b.value) for b in bindings(func) if isinstance(b, relax.VarBinding) and is_quantizable(b.value)]


def describe(func: Any) -> list[QuantOp]:
    """The quantizable ops of ``func`` as :class:`QuantOp` records."""
    out = []
    for i, (b, call) in enumerate(quantizable(func)):
        shape = tuple(int(v) for v in call.args[1].ty.shape.values)
        out.append(QuantOp(i, str(call.op.name).removeprefix("relax.").removeprefix("nn."), f"{i}:{b.var.name}", shape))
    return out


def expose(mod: Any, pick: Any) -> tuple[Any, int]:
    """A copy of ``mod`` whose ``main`` returns ``(original outputs, (picked tensors...))``.

    ``pick(func)`` returns the Relax variables (bound in ``main`` or its parameters) to expose; it runs on
    the non-dataflow form of ``main`` (dataflow variables cannot leave their block).  Returns the module
    and how many tensors were exposed.
    """
    import tvm
    from tvm import relax

    from ..importer.strides import restore_quotient_prologue

    flat = relax.transform.ToNonDataflow()(mod)
    func = flat["main"]
    picked = list(pick(func))
    body = func.body
    ret = relax.Tuple([body.body, relax.Tuple(picked)])
    new_body = relax.SeqExpr(body.blocks, ret)
    ret_ty = relax.TupleType([func.ret_ty, relax.TupleType([v.ty for v in picked])])
    new_func = relax.Function(func.params, new_body, ret_ty, func.is_pure, func.attrs)
    out = tvm.IRModule(dict(flat.functions.items()), attrs=flat.attrs)
    out["main"] = new_func
    out = relax.transform.Normalize()(out)
    return restore_quotient_prologue(relax.transform.ConvertToDataflow()(out)), len(picked)
