"""Rewrites that put imported Relax graphs into the forms later passes handle (and compute correctly).

* ``strided_slice`` with constant bounds on symbolic dimensions: made exact (:mod:`.slices`).
* The ONNX Clip importer emits ``call_tir(maximum/minimum, (x, scalar))``: turned back into
  ``relax.maximum``/``minimum``/``nn.relu`` so layout conversion and fusion see through it.
* ONNX ``Sum/Max/Min/Mean(a, b, ...)`` import as ``sum/max/min/mean(stack([a, b]), axis=0)``; the stacked
  axis breaks ``ConvertLayout`` ("Invalid SLayout") and is slow: rewritten as chains of binary ops.
* ``squeeze`` axes are made positive (``ConvertLayout`` dies with ``std::bad_alloc`` on negative ones;
  torch's dynamo exporter emits ``squeeze(-2)``).
* Identity ``broadcast_to`` and inference-mode ``dropout`` are removed.
* ``power(x, 2)`` and ``power(x, 3)`` become products, as onnxruntime computes them.
* A zero ``pad`` before a convolution becomes the convolution's own padding.
* ``clip`` becomes ``relu``/``maximum`` + ``minimum``; binary elementwise ops get one-element constants as scalars, and commutative ones take the constant
  second, so ``ConvertLayout`` keeps them in NHWC.
* Outputs that TVM folded to shapes or integer expressions become tensors again (:func:`tensor_outputs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import Op

from .padding import conv_padding
from .slices import exact_strided_slice

# reduction over a stack of operands -> the binary op that chains them (mean divides afterwards)
_COMMUTATIVE = {"relax.add", "relax.multiply", "relax.maximum", "relax.minimum"}
_ELEMENTWISE = _COMMUTATIVE | {"relax.subtract", "relax.divide", "relax.power"}
_STACK_REDUCE = {"relax.sum": relax.op.add, "relax.max": relax.op.maximum, "relax.min": relax.op.minimum,
                 "relax.mean": relax.op.add}


@relax.expr_functor.mutator
class Canonicalizer(relax.PyExprMutator):
    """The rewrites of this module, in one walk."""

    def __init__(self, mod: tvm.IRModule | None = None) -> None:
        super().__init__(mod)

    def _const(self, expr: Any) -> np.ndarray | None:
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            expr = expr if bound is None else bound
        if isinstance(expr, tvm.ir.expr.Constant):
            value = expr.value
            return value.numpy() if hasattr(value, "numpy") else np.array(value, dtype=str(expr.ty.dtype))
        return None

    def _bound(self, expr: Any) -> Any:
        """What a variable is bound to (itself when it is not bound here), other expressions unchanged."""
        if not isinstance(expr, relax.Var):
            return expr
        bound = self.lookup_binding(expr)
        return expr if bound is None else bound

    def visit_tuple_getitem_(self, op: Any) -> Any:
        op = super().visit_tuple_getitem_(op)
        producer = self._bound(op.tuple_value)
        if (isinstance(producer, relax.Call) and isinstance(producer.op, Op)
                and producer.op.name == "relax.nn.dropout" and op.index == 0):
            return producer.args[0]  # inference-mode dropout is the identity
        return op

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        if not isinstance(call.op, Op):
            return call
        for rewrite in (self._slice_ends, self._clip, self._stack_reduce, self._squeeze, self._broadcast,
                        self._small_power, self._constant_last, self._clip_op, self._pad_into_conv):
            new = rewrite(call)
            if new is not None:
                return new
        return call

    def _slice_ends(self, call: Any) -> Any:
        return exact_strided_slice(call)

    def _clip_op(self, call: Any) -> Any:
        """``relax.clip(x, lo, hi)`` (HardSwish, HardSigmoid, ReLU6 import as it) -> ``relu``/``maximum`` and
        ``minimum`` with scalar constants: ConvertLayout has no layout rule for ``clip``, so each one was
        wrapped in two transposes out of and back into NHWC."""
        if call.op.name != "relax.clip" or len(call.args) != 3:
            return None
        x, lo, hi = call.args
        dtype = str(getattr(x.ty, "dtype", ""))
        if not dtype.startswith("float"):
            return None
        try:
            low, high = float(lo.value), float(hi.value)
        except (AttributeError, TypeError, ValueError):
            return None
        y = x
        if low == 0.0:
            y = relax.op.nn.relu(y)
        elif np.isfinite(low):
            y = relax.op.maximum(y, relax.const(low, dtype))
        if np.isfinite(high):
            y = relax.op.minimum(y, relax.const(high, dtype))
        return y

    def _pad_into_conv(self, call: Any) -> Any:
        """``conv(pad(x, 0), padding=p)`` -> ``conv(x, padding=p + the pad's spatial widths)`` when the pad adds
        zeros on spatial axes only: the conv pads with zeros itself, inside its kernel, while an explicit pad
        (tf2onnx writes SAME padding as ``Pad -> Conv``) is a pass of its own over the tensor."""
        if call.op.name not in ("relax.nn.conv2d", "relax.nn.conv1d"):
            return None
        padded = self._bound(call.args[0])
        if not (isinstance(padded, relax.Call) and isinstance(padded.op, Op) and padded.op.name == "relax.nn.pad"
                and padded.attrs.pad_mode == "constant" and float(padded.attrs.pad_value) == 0.0):
            return None
        a = call.attrs
        layout = str(a.data_layout)
        extra = conv_padding(layout, [int(w) for w in padded.attrs.pad_width])
        pads = [int(p) for p in a.padding]  # all befores, then all afters
        if extra is None or len(pads) != len(extra):
            return None
        padding = [p + e for p, e in zip(pads, extra)]
        conv = relax.op.nn.conv2d if call.op.name == "relax.nn.conv2d" else relax.op.nn.conv1d
        return conv(padded.args[0], call.args[1], strides=a.strides, padding=padding, dilation=a.dilation,
                    groups=a.groups, data_layout=layout, kernel_layout=str(a.kernel_layout),
                    out_layout=str(a.out_layout), out_dtype=a.out_dtype)

    def _small_power(self, call: Any) -> Any:
        """``power(x, 2)`` -> ``x * x`` and ``power(x, 3)`` -> ``(x * x) * x`` for float ``x``: what onnxruntime
        computes for those two exponents (bit for bit, measured on 10^5 values; it calls ``pow`` for others).
        TVM lowers ``power`` to a scalar libm ``powf`` call per element: the tanh-GELU of a T5 encoder's FFN
        (``x + 0.044715 * pow(x, 3)``, 8 layers of 29 x 1024) took 0.18 of its fused kernel's 0.25 ms."""
        if call.op.name != "relax.power" or len(call.args) != 2:
            return None
        x, exponent = call.args[0], self._const(call.args[1])
        dtype = str(getattr(x.ty, "dtype", ""))
        if exponent is None or exponent.size != 1 or not dtype.startswith(("float", "bfloat")):
            return None
        if getattr(x.ty, "ndim", -1) < exponent.ndim:
            return None  # the exponent's shape would broadcast the result
        square = relax.op.multiply(x, x)
        return {2.0: square, 3.0: relax.op.multiply(square, x)}.get(float(exponent.reshape(())))

    def _constant_last(self, call: Any) -> Any:
        """``op(constant, x)`` -> ``op(x, constant)`` for commutative ``op``, and a one-element constant of
        rank >= 1 (``[1]``, ``[1, 1, 1, 1]``) -> a scalar, for every elementwise binary op.

        ConvertLayout infers a binary op's layout from its operands and keeps NCHW when it cannot relate
        them (a constant first, or of another rank): PP-LCNet's learnable affine blocks import as
        ``multiply(scale[1], x)``, and every such op cost a transpose out of NHWC and one back
        (PP-OCRv4 det: 2 x 18 transposes, ~20 % of its time, measured with an instrumented VM)."""
        if call.op.name not in _ELEMENTWISE or len(call.args) != 2:
            return None
        consts = [self._const(a) for a in call.args]
        if (consts[0] is None) == (consts[1] is None):
            return None  # both constants (folded later) or neither
        pos = 0 if consts[0] is not None else 1
        value, arg, other = consts[pos], call.args[pos], call.args[1 - pos]
        # a scalar broadcasts like the one-element tensor as long as the other operand has at least its rank
        scalar = value.size == 1 and 1 <= value.ndim <= getattr(other.ty, "ndim", -1)
        swap = pos == 0 and call.op.name in _COMMUTATIVE
        if not (scalar or swap):
            return None
        if scalar:
            arg = relax.const(value.reshape(()), str(value.dtype))
        args = [other, arg] if pos == 1 or swap else [arg, other]
        return relax.Call(call.op, args, call.attrs, call.ty_args, call.span)

    def _clip(self, call: Any) -> Any:
        """``call_tir(maximum|minimum, (x, scalar))`` from the ONNX Clip importer -> Relax ops."""
        if call.op.name != "relax.call_tir" or not isinstance(call.args[0], tvm.ir.GlobalVar):
            return None
        func = self.builder_.get()[call.args[0]]
        if not isinstance(func, tvm.tirx.PrimFunc) or not isinstance(call.args[1], relax.Tuple):
            return None
        try:
            sch = tvm.s_tir.Schedule(func)
            blocks = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
        except Exception:  # noqa: BLE001 - not a simple elementwise PrimFunc
            return None
        args = list(call.args[1].fields)
        # on symbolic shapes the call also passes the shape variables it uses (``W``)
        if len(args) > 2 and all(tvm.ir.is_prim_expr(a) for a in args[2:]):
            args = args[:2]
        value = self._const(args[1]) if len(args) == 2 else None
        if value is None or value.size != 1 or blocks not in (["T_maximum"], ["T_minimum"]):
            return None
        scalar = float(value.reshape(()))
        if blocks == ["T_maximum"] and scalar == 0.0:
            return relax.op.nn.relu(args[0])
        # A per-channel-shaped constant (like a conv bias) keeps ConvertLayout happy; a 0-d scalar operand
        # makes it fall back to transposes around every clip.
        ty = args[0].ty
        dims = list(ty.shape.values) if ty.shape is not None else []
        cshape = [1, int(dims[1]), 1, 1] if len(dims) == 4 and isinstance(dims[1], tvm.tirx.IntImm) else []
        constant = relax.const(np.full(cshape, scalar, dtype=str(ty.dtype)))
        return relax.op.maximum(args[0], constant) if blocks == ["T_maximum"] else relax.op.minimum(args[0], constant)

    def _stack_reduce(self, call: Any) -> Any:
        name = call.op.name
        if name not in _STACK_REDUCE or not isinstance(call.args[0], relax.Var):
            return None
        stacked = self.lookup_binding(call.args[0])
        if not (isinstance(stacked, relax.Call) and isinstance(stacked.op, Op) and stacked.op.name == "relax.stack"
                and int(stacked.attrs.axis) == 0 and call.attrs.axis is not None
                and [int(x) for x in call.attrs.axis] == [0] and not call.attrs.keepdims):
            return None
        operands = self._bound(stacked.args[0])
        if not isinstance(operands, relax.Tuple):
            return None
        binary = _STACK_REDUCE[name]
        acc = operands.fields[0]
        for field in operands.fields[1:]:
            acc = self.builder_.emit(binary(acc, field))
        if name == "relax.mean":
            count = relax.const(np.array(len(operands.fields), dtype=str(call.ty.dtype)))
            acc = self.builder_.emit(relax.op.divide(acc, count))
        return acc

    def _squeeze(self, call: Any) -> Any:
        if call.op.name != "relax.squeeze" or call.attrs.axis is None:
            return None
        axes = [int(a) for a in call.attrs.axis]
        ndim = getattr(call.args[0].ty, "ndim", -1)
        if any(a < 0 for a in axes) and ndim >= 0:
            return relax.op.squeeze(call.args[0], axis=[a % ndim for a in axes])
        return None

    def _broadcast(self, call: Any) -> Any:
        if call.op.name != "relax.broadcast_to":  # identity broadcasts (ONNX Sum emits these)
            return None
        source = call.args[0].ty
        if (getattr(source, "shape", None) is not None and getattr(call.ty, "shape", None) is not None
                and tvm_ffi.structural_equal(source.shape, call.ty.shape)):
            return call.args[0]
        return None


def canonicalize(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the rewrites of this module applied to every Relax function."""
    canon = Canonicalizer(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new = canon.visit_expr(func)
            mod = canon.builder_.get()
            mod[gv] = new
    mod = tensor_outputs(mod)
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))


@tvm.transform.module_pass(opt_level=0, name="forgekit.Canonicalize")
def Canonicalize(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:  # noqa: N802 - a pass, named like TVM's
    """:func:`canonicalize` as a module pass."""
    return canonicalize(mod)


def tensor_outputs(mod: tvm.IRModule) -> tvm.IRModule:
    """``main`` returning tensors only: an ONNX graph output is always a tensor, but TVM's frontend returns
    what it folded a ``Shape`` (a shape) or a ``Gather`` of one (an integer expression such as ``N``) to,
    which no runtime can hand back as an array."""
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod
    func = mod["main"]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return mod
    bindings: list[Any] = []
    body = _as_tensor(func.body.body, bindings, relax.BlockBuilder())
    if not bindings:
        return mod
    blocks = [*func.body.blocks, relax.BindingBlock(bindings)]
    ret_ty = relax.TupleType([f.ty for f in body.fields]) if isinstance(body, relax.Tuple) else body.ty
    mod["main"] = relax.Function(func.params, relax.SeqExpr(blocks, body), ret_ty, attrs=func.attrs)
    return relax.transform.Normalize()(mod)


def _bind(expr: Any, bindings: list[Any], bb: Any) -> Any:
    expr = bb.normalize(expr)
    var = relax.Var(f"output_{len(bindings)}", expr.ty)
    bindings.append(relax.VarBinding(var, expr))
    return var


def _as_tensor(expr: Any, bindings: list[Any], bb: Any) -> Any:
    ty = getattr(expr, "ty", None)
    if isinstance(expr, relax.Tuple):
        fields = [_as_tensor(f, bindings, bb) for f in expr.fields]
        return relax.Tuple(fields) if any(a is not b for a, b in zip(fields, expr.fields)) else expr
    if isinstance(ty, relax.ShapeType) or isinstance(expr, relax.ShapeExpr):
        return _bind(relax.op.shape_to_tensor(expr), bindings, bb)
    if isinstance(ty, tvm.ir.PrimType) and str(ty.dtype).startswith("int") and tvm.ir.is_prim_expr(expr):
        vector = _bind(relax.op.shape_to_tensor(relax.ShapeExpr([expr])), bindings, bb)
        return _bind(relax.op.reshape(vector, []), bindings, bb)
    return expr
