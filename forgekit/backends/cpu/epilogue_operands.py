"""Small tensors computed at run time stay out of the conv/matmul kernels whose epilogue reads them.

onnxruntime's ``quantize_dynamic`` writes each ``ConvInteger``'s bias as ``Cast(Floor(bias / (x_scale *
w_scale)))``, with ``x_scale`` known only at run time: a chain of a dozen injective ops on a ``[C]`` vector,
added to the convolution's int32 result.  FuseOps pulls that chain into the convolution's kernel with the rest
of the epilogue; the kernel then starts with a prologue no conv rule recognizes, so it fell to the generic
pool schedule, which also recomputes the chain for every output element.  On ddddocr's quantized CAPTCHA
recognizer 20 such convolutions took 17 ms of a 33 ms inference (onnxruntime: 18.6 ms for all of it).

This pass, between AnnotateTIROpPattern and FuseOps, marks the last op of such a chain opaque: the chain
fuses into one small kernel of its own, and the convolution's kernel is conv + epilogue again, which the int8
and float conv rules schedule.  It applies to a call whose result is small (at most :data:`SMALL` elements,
static), injective, computed at run time (constants are folded before), and read by an elementwise op
whose output is at least :data:`RATIO` times larger (or of a symbolic size) and whose other operand comes
from a convolution or matmul (an out-fusable op, through at most :data:`HOPS` injective ops).

Why not TVM: FuseOps has no size or cost notion (its groups follow op patterns only), and its
``FuseOpsByPattern`` fuses named patterns in, it cannot keep one out.
"""

from __future__ import annotations

from typing import Any

from ...passes.quantize_layout import static_elements

#: Largest result (elements) kept apart: a per-channel vector (a bias, a scale), not an activation.
SMALL = 4096
#: The reader's result at least this many times larger: recomputing per element is what costs.
RATIO = 16
#: Injective ops looked through between the reader and the convolution (layout, casts, zero-point terms).
HOPS = 8
#: relax OpPatternKind values.
_INJECTIVE, _OUT_EWISE_FUSABLE, _OPAQUE = 2, 4, 8


def _symbolic(expr: Any) -> bool:
    """Whether ``expr``'s shape has a symbolic dimension (a dynamic width or length: an activation's size)."""
    values = getattr(getattr(getattr(expr, "ty", None), "shape", None), "values", None)
    return values is not None and any(not hasattr(dim, "value") for dim in values)


def keep_epilogue_operands_apart() -> Any:
    """The module pass (see the module docstring)."""
    import tvm
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")

    def pattern(mod: Any, call: Any) -> int | None:
        func = mod[call.args[0]]
        value = func.attrs.get("op_pattern") if func.attrs is not None else None
        return None if value is None else int(value)

    def tensor_args(call: Any) -> list[Any]:
        return [a for a in call.args[1].fields if isinstance(a, relax.Var)]

    def chosen(mod: Any, func: Any) -> set[Any]:
        producer: dict[Any, Any] = {}
        users: dict[Any, list[Any]] = {}
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                if isinstance(call, relax.Call) and call.op == call_tir:
                    producer[binding.var] = call
                    for arg in tensor_args(call):
                        users.setdefault(arg, []).append((binding.var, call))

        def from_out_fusable(var: Any, hops: int = HOPS) -> bool:
            call = producer.get(var)
            kind = None if call is None else pattern(mod, call)
            if kind == _OUT_EWISE_FUSABLE:
                return True
            if kind is None or kind > _INJECTIVE or hops == 0:
                return False
            # every operand: an integer conv's zero-point corrections (``acc - zx * sum(w) - zw * box``,
            # :mod:`forgekit.importer.converters.int_conv`) sit between it and the bias add
            return any(from_out_fusable(arg, hops - 1) for arg in tensor_args(call))

        picked = set()
        for var, call in producer.items():
            size = static_elements(var)
            kind = pattern(mod, call)
            if size is None or size > SMALL or kind is None or kind > _INJECTIVE:
                continue
            for out, user in users.get(var, []):
                big, user_kind = static_elements(out), pattern(mod, user)
                # a symbolic reader counts as large: with the recognizer's width dynamic, the chain fused back
                # into all 20 convolutions (7-8 s to lower each, 7 min to compile the artifact's three levels)
                large = _symbolic(out) if big is None else big >= RATIO * max(size, 1)
                if (large and user_kind is not None
                        and user_kind <= _INJECTIVE
                        and any(not a.same_as(var) and from_out_fusable(a) for a in tensor_args(user))):
                    picked.add(var)
                    break
        return picked

    @relax.expr_functor.mutator
    class Apart(relax.PyExprMutator):
        def __init__(self, mod: Any, picked: set[Any]) -> None:
            super().__init__(mod)
            self.mod, self.picked, self.copies = mod, picked, {}

        def visit_var_binding_(self, binding: Any) -> None:
            if binding.var not in self.picked:
                return super().visit_var_binding_(binding)
            call = binding.value
            gv = call.args[0]
            if gv not in self.copies:  # an opaque twin: other uses of the PrimFunc keep fusing
                func = self.mod[gv].with_attr("op_pattern", _OPAQUE)
                self.copies[gv] = self.builder_.add_func(func, f"{gv.name_hint}_apart")
            new = self.builder_.normalize(
                relax.Call(call.op, [self.copies[gv], *call.args[1:]], call.attrs, call.ty_args))
            self.builder_.emit_normalized(relax.VarBinding(binding.var, new))

    @tvm.transform.module_pass(opt_level=0, name="forgekit.KeepEpilogueOperandsApart")
    def apart(mod: Any, _ctx: Any) -> Any:
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            picked = chosen(mod, func)
            if picked:
                mutator = Apart(mod, picked)
                mutator.builder_.update_func(gv, mutator.visit_expr(func))
                mod = mutator.builder_.get()
        return mod

    return apart
