"""Relax-level passes that run before legalization.

* ``NumpyFoldConstant``: folds calls whose arguments are all constants with numpy.  The stock
  ``relax.transform.FoldConstant`` JIT-compiles one TIR kernel per constant sub-graph, which costs
  20+ s on ResNet-50 after batch-norm folding; numpy does the same in well under a second.
* ONNX ``Sum/Max/Min/Mean(a, b, ...)`` import as ``sum/max/min/mean(stack([a, b]), axis=0)``; the
  stacked axis breaks ``ConvertLayout`` and is slow.  Rewritten to ``add``/``maximum``/``minimum`` chains.
* squeeze axes are made positive (``ConvertLayout`` crashes with ``std::bad_alloc`` on negative ones).
* ``to_nhwc``: ConvertLayout conv2d -> NHWC data / HWIO kernel (output channels innermost, so the
  micro-kernels vectorize over output channels and the weights are pre-packed at compile time).
"""
import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import Op

_np_unary = {
    "relax.sqrt": np.sqrt, "relax.negative": np.negative, "relax.exp": np.exp,
    "relax.rsqrt": lambda x: 1.0 / np.sqrt(x), "relax.abs": np.abs,
}
_np_binary = {
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
    "relax.divide": np.divide, "relax.power": np.power, "relax.maximum": np.maximum,
    "relax.minimum": np.minimum,
}


# reduction over a stack of operands -> the binary op that chains them (mean divides afterwards)
_STACK_REDUCE = {"relax.sum": relax.op.add, "relax.max": relax.op.maximum, "relax.min": relax.op.minimum,
                 "relax.mean": relax.op.add}


def _shape_of(e):
    if isinstance(e, relax.ShapeExpr):
        return [int(v) for v in e.values]
    return None


def _np_eval(call, vals):
    """Evaluate `call` on numpy values, or return None when unsupported."""
    name = call.op.name
    a = call.attrs
    if name in _np_unary:
        return _np_unary[name](vals[0])
    if name in _np_binary:
        return _np_binary[name](vals[0], vals[1])
    if name == "relax.reshape":
        s = _shape_of(call.args[1])
        return None if s is None else vals[0].reshape(s)
    if name == "relax.permute_dims":
        axes = None if a.axes is None else [int(x) for x in a.axes]
        return np.transpose(vals[0], axes)
    if name == "relax.broadcast_to":
        s = _shape_of(call.args[1])
        return None if s is None else np.ascontiguousarray(np.broadcast_to(vals[0], s))
    if name == "relax.expand_dims":
        return np.expand_dims(vals[0], tuple(int(x) for x in a.axis))
    if name == "relax.squeeze":
        return np.squeeze(vals[0], None if a.axis is None else tuple(int(x) for x in a.axis))
    if name == "relax.isnan":
        return np.isnan(vals[0])
    if name == "relax.where":
        return np.where(vals[0], vals[1], vals[2])
    if name == "relax.astype":
        return vals[0].astype(str(a.dtype))
    return None


@relax.expr_functor.mutator
class _NpFolder(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)

    @staticmethod
    def _cval(c):
        v = c.value
        if hasattr(v, "numpy"):
            return v.numpy()
        return np.array(v, dtype=str(c.ty.dtype))

    def _value(self, e):
        if isinstance(e, tvm.ir.expr.Constant):
            return self._cval(e)
        if isinstance(e, relax.Var):
            b = self.lookup_binding(e)
            if b is not None and isinstance(b, tvm.ir.expr.Constant):
                return self._cval(b)
        return None

    def visit_tuple_getitem_(self, op):
        op = super().visit_tuple_getitem_(op)
        t = op.tuple_value
        if isinstance(t, relax.Var):
            t = self.lookup_binding(t)
        # inference-mode dropout is the identity
        if (isinstance(t, relax.Call) and isinstance(t.op, Op) and t.op.name == "relax.nn.dropout"
                and op.index == 0):
            return t.args[0]
        return op

    def _call_tir_to_op(self, call):
        """The ONNX Clip importer emits call_tir(maximum/minimum, (x, scalar)); turn it back into
        relax.maximum / relax.minimum so layout conversion and fusion see through it."""
        if call.op.name != "relax.call_tir" or not isinstance(call.args[0], tvm.ir.GlobalVar):
            return None
        gv = call.args[0]
        func = self.builder_.get()[gv]
        if not isinstance(func, tvm.tirx.PrimFunc) or not isinstance(call.args[1], relax.Tuple):
            return None
        try:
            sch = tvm.s_tir.Schedule(func)
            blk_names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
        except Exception:  # pylint: disable=broad-except
            return None
        args = list(call.args[1].fields)
        if len(args) != 2:
            return None
        real = [b for b in blk_names if b != "root"]
        c = self._value(args[1])
        if c is None or c.size != 1:
            return None
        c = float(c.reshape(()))
        if real not in (["T_maximum"], ["T_minimum"]):
            return None
        if real == ["T_maximum"] and c == 0.0:
            return relax.op.nn.relu(args[0])
        # A per-channel-shaped constant (like a conv bias) keeps ConvertLayout happy; a 0-d
        # scalar operand makes it fall back to transposes around every clip.
        ty = args[0].ty
        shp = [int(d) for d in ty.shape.values] if ty.shape is not None else None
        if shp is not None and len(shp) == 4:
            cshape = [1, shp[1], 1, 1]
        else:
            cshape = []
        cst = relax.const(np.full(cshape, c, dtype=str(ty.dtype)))
        if real == ["T_maximum"]:
            return relax.op.maximum(args[0], cst)
        return relax.op.minimum(args[0], cst)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not isinstance(call.op, Op):
            return call
        name = call.op.name
        rep = self._call_tir_to_op(call)
        if rep is not None:
            return rep
        # ONNX Sum/Max/Min/Mean import as sum/max/min/mean(stack(xs), axis=0); ConvertLayout cannot
        # handle the extra stacked axis ("Invalid SLayout"): turn them into a chain of binary ops.
        if name in _STACK_REDUCE and isinstance(call.args[0], relax.Var):
            st = self.lookup_binding(call.args[0])
            if (isinstance(st, relax.Call) and isinstance(st.op, Op) and st.op.name == "relax.stack"
                    and int(st.attrs.axis) == 0 and call.attrs.axis is not None
                    and [int(x) for x in call.attrs.axis] == [0] and not call.attrs.keepdims):
                tup = st.args[0]
                if isinstance(tup, relax.Var):
                    tup = self.lookup_binding(tup)
                if isinstance(tup, relax.Tuple):
                    binary = _STACK_REDUCE[name]
                    acc = tup.fields[0]
                    for f in tup.fields[1:]:
                        acc = self.builder_.emit(binary(acc, f))
                    if name == "relax.mean":
                        n = relax.const(np.array(len(tup.fields), dtype=str(call.ty.dtype)))
                        acc = self.builder_.emit(relax.op.divide(acc, n))
                    return acc
        if name == "relax.squeeze" and call.attrs.axis is not None:
            # ConvertLayout's squeeze inference dies with std::bad_alloc on a negative axis (TVM
            # 0.27; torch's dynamo exporter emits squeeze(-2)): make the axes positive.
            axes = [int(a) for a in call.attrs.axis]
            ndim = getattr(call.args[0].ty, "ndim", -1)
            if any(a < 0 for a in axes) and ndim >= 0:
                return relax.op.squeeze(call.args[0], axis=[a % ndim for a in axes])
        if name == "relax.broadcast_to":  # identity broadcast (ONNX Sum emits these)
            ty = call.args[0].ty
            if (hasattr(ty, "shape") and ty.shape is not None and hasattr(call.ty, "shape")
                    and call.ty.shape is not None
                    and tvm_ffi.structural_equal(ty.shape, call.ty.shape)):
                return call.args[0]
        tensor_args = [x for x in call.args if not isinstance(x, relax.ShapeExpr)]
        vals = [self._value(x) for x in tensor_args]
        if not tensor_args or any(v is None for v in vals):
            return call
        try:
            out = _np_eval(call, vals)
        except Exception:  # pylint: disable=broad-except
            return call
        if out is None:
            return call
        dtype = call.ty.dtype if hasattr(call.ty, "dtype") else out.dtype
        return relax.const(np.ascontiguousarray(out).astype(str(dtype)))


@tvm.transform.module_pass(opt_level=0, name="NumpyFoldConstant")
def NumpyFoldConstant(mod, _ctx):  # pylint: disable=invalid-name
    """Fold constant sub-expressions with numpy (and rewrite ONNX Sum)."""
    folder = _NpFolder(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            f = folder.visit_expr(func)
            mod = folder.builder_.get()
            mod[gv] = f
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))


def to_nhwc():
    """Convert conv2d (and, by propagation, pooling / elementwise ops) to NHWC + HWIO."""
    # conv2d_transpose stays NCHW: its layout is otherwise inferred from the NHWC producer, and TVM
    # 0.27 only legalizes NCHW conv2d_transpose (an NHWC one reaches the VM unlowered).
    return relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"],
                                          "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]})


def preprocess(use_nhwc=True):
    """The Relax-level prefix of the pipeline."""
    T = relax.transform
    seq = [NumpyFoldConstant, T.FoldBatchnormToConv2D(), NumpyFoldConstant]
    if use_nhwc:
        seq += [to_nhwc(), NumpyFoldConstant]
    return tvm.transform.Sequential(seq, name="forgekit.CpuPreprocess")
