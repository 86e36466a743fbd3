"""bf16 activations between layers: a tensor that feeds bf16 convolutions is rounded once, by the kernel that
computes it, and stored as bf16 bits (``uint16``, half the bytes); the convolutions read those bits as they are,
and its other readers (a residual add, a pooling, a concat) widen them back to fp32 as they load them.

Without it every bf16 convolution rounded its fp32 input in a prologue pass of its own (:mod:`.bf16`): the
producer wrote 4 bytes per value, the prologue read them and wrote 2, the GEMM read those 2, and a residual
add read the 4 again.  ResNet-50's 56x56x256 residual stream moved 12.8 MB per block that way, 4.8 MB now.

That traffic is what made forgekit's bf16 speed depend on the machine's load.  ResNet-50 bf16 profiled per
kernel in the phases when this VM's host was busy (2 threads, alternating with OpenVINO in one process): the
memory-bound kernels slowed most (Winograd input transforms 3.3-3.7x, the layer-1 1x1 convs with their
prologue and residual 1.5-1.7x, the GEMMs 1.1x), 18.4 -> 24.4 ms, while OpenVINO, which keeps its
activations in bf16, slowed 1.05x.  With this pass, timed alternating with the old build and OpenVINO over
120 s: median 18.11 -> 17.70 ms, and in the busy windows 23.85 -> 19.89 ms (OpenVINO 21.47).

Numerics: the values a bf16 convolution reads are the same as before (round to nearest even of the same fp32
value).  What changes is that the other readers see the rounded value too, as in OpenVINO's bf16 mode: a
residual stream is carried in bf16.  PP-OCRv4 det on a text-like 640x640 image, cosine against fp32
onnxruntime: 0.999326 before, 0.999335 after (OpenVINO bf16: 0.995).  A tensor stays fp32 when no bf16
convolution reads it, when an operator other than an elementwise/data-movement one also reads it (a depthwise
conv kept in fp32: the widening would be a pass of its own), and when a model output is made of it by such
operators only (a layout transpose would output the rounded value).

The round is an elementwise op after the producer, the only reader of the producer's fp32 result, so TVM's
FuseOps fuses it into the producer's kernel as its epilogue (the kernel then writes bf16 only); the widening
is an elementwise op before each other reader, fused into it.  A tensor that is a function input, or whose
producer is not an operator call, keeps the per-convolution prologue.

Why not a library pass: TVM 0.27's ``ToMixedPrecision`` casts to ``bfloat16``, a dtype its CPU codegen
lowers to fp32 arithmetic (see :mod:`.bf16`) and that our kernels do not take; and it decides per operator,
not per tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tvm
from tvm import relax, te

from ...passes.functions import rewrite_functions
from . import bf16

if TYPE_CHECKING:
    from ...targets.isa import IsaInfo


#: ``TMixedPrecisionPolicy`` of the ops that follow their input's type (``MixedPrecisionPolicyKind.kFollow``)
_FOLLOW = 1
#: the blocks that widen bf16 bits to fp32 (:func:`inline_widening`)
WIDEN = "widen_bf16"


def _round(x: Any) -> Any:
    return te.compute(x.shape, lambda *i: bf16.to_bf16(x(*i)), name="round_bf16")


def _widen(r: Any) -> Any:
    return te.compute(r.shape, lambda *i: bf16.from_bf16(r(*i)), name=WIDEN)


def inline_widening(sch: Any) -> None:
    """Inline the widening blocks of a fused kernel into their readers (a residual add after a convolution
    reads the bits as it adds): fused in as a block of its own, it was a producer no rule expects next to its
    main block (the conv rules refused those kernels, which fell to the pool rule)."""
    from .rules.common import blocks_of

    for b in blocks_of(sch):
        if sch.get(b).name_hint.startswith(WIDEN):
            try:
                sch.compute_inline(b)
            except Exception:  # pylint: disable=broad-except  # a kernel that only widens: it is the output
                pass


def _static_fp32(var: Any) -> bool:
    ty = getattr(var, "ty", None)
    shape = getattr(ty, "shape", None)
    return (isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32" and shape is not None
            and all(isinstance(v, int) or hasattr(v, "value") for v in getattr(shape, "values", [])))


def _follows(value: Any) -> bool:
    """Whether ``value`` is a call of an op that TVM's mixed-precision pass lets follow its input's type
    (elementwise, broadcast, concat, resize, pooling): the widening fuses into those.  Not into a convolution
    or matmul kept in fp32 (a depthwise conv, 8 output channels): there it ran as a pass of its own, and
    PP-OCRv4 det has 3 of them, so such a tensor keeps the per-convolution rounding."""
    op = getattr(value, "op", None) if isinstance(value, relax.Call) else None
    if not isinstance(op, tvm.ir.Op):
        return False
    return op.get_attr("TMixedPrecisionPolicy") == _FOLLOW


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    """Per dataflow block: plan which tensors go bf16 (:meth:`_plan`), then rewrite the bindings."""

    def __init__(self, mod: Any, tinfo: IsaInfo) -> None:
        super().__init__(mod)
        self.tinfo = tinfo
        self.convs: dict[Any, bf16.ConvPlan] = {}  # conv binding var -> its plan (its data goes bf16)
        self.rounds: set[Any] = set()  # tensors stored in bf16
        self.widened: set[Any] = set()  # ... that other readers read too
        self.bits: dict[Any, Any] = {}  # tensor -> the new var of its bf16 bits

    def _plan(self, block: Any) -> None:
        produced = {b.var for b in block.bindings
                    if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call)}
        convs: dict[Any, tuple[bf16.ConvPlan, Any]] = {}  # conv binding var -> (its plan, its data)
        readers: dict[Any, list[str]] = {}  # tensor -> per reading binding: "conv" (bf16, as its data), "follow"
        for b in block.bindings:            # (an op the widening fuses into) or "other"
            value = b.value if isinstance(b, relax.VarBinding) else None
            plan = bf16.conv_plan(value) if isinstance(value, relax.Call) else None
            for v in relax.analysis.free_vars(b.value):
                if plan is not None and v.same_as(value.args[0]) and not v.same_as(value.args[1]):
                    kind = "conv"
                else:
                    kind = "follow" if _follows(value) else "other"
                readers.setdefault(v, []).append(kind)
            if plan is not None:
                convs[b.var] = (plan, value.args[0])
        # what a function output is made of without an operator that rounds anyway (a layout transpose, an
        # add, a concat: they would output the rounded value): those tensors stay fp32
        exported: set[Any] = set()
        for b in reversed(list(block.bindings)):
            if not isinstance(b.var, relax.DataflowVar) or b.var in exported:
                if not isinstance(b.value, relax.Call) or _follows(b.value):
                    exported.update(relax.analysis.free_vars(b.value))
        for v, kinds in readers.items():
            # a DataflowVar is read in this block only; a function output (a Var) stays fp32
            if ("conv" in kinds and "other" not in kinds and v in produced and v not in exported
                    and isinstance(v, relax.DataflowVar) and _static_fp32(v)):
                self.rounds.add(v)
                if "follow" in kinds:
                    self.widened.add(v)
        self.convs.update({var: plan for var, (plan, data) in convs.items() if data in self.rounds})

    def visit_dataflow_block_(self, block: Any) -> Any:
        self._plan(block)
        return super().visit_dataflow_block_(block)

    def visit_var_binding_(self, binding: Any) -> None:
        var = binding.var
        plan = self.convs.get(var)
        if plan is not None:
            out = bf16.emit_conv(self.builder_, plan, self.bits[binding.value.args[0]], self.tinfo, rounded=True)
            self.set_var_remap(var, self.builder_.emit(out, name_hint=var.name))
        else:
            super().visit_var_binding_(binding)
        # a bf16 conv's output read by another bf16 conv (conv -> conv, no activation between) is rounded
        # too: returning after the conv left it without bits and the reader failed (KeyError, exit 6)
        if var in self.rounds:
            bits = self.builder_.emit(self.builder_.call_te(_round, self.visit_expr(var),
                                                            primfunc_name_hint="round_bf16"),
                                      name_hint=f"{var.name}_bf16")
            self.bits[var] = bits
            if var in self.widened:
                wide = self.builder_.emit(self.builder_.call_te(_widen, bits, primfunc_name_hint=WIDEN),
                                          name_hint=f"{var.name}_wide")
                self.set_var_remap(var, wide)


def bf16_activations(mod: Any, tinfo: IsaInfo) -> Any:
    """Rewrite every Relax function of ``mod`` (NHWC, before legalization) as the module docstring says."""
    if not bf16.has_bf16(tinfo):
        return mod
    return rewrite_functions(_Rewrite(mod, tinfo), mod)


def bf16_activations_pass(target: Any) -> Any:
    """:func:`bf16_activations` as a module pass for ``target``."""
    from ...targets.isa import isa_info

    @tvm.transform.module_pass(opt_level=0, name="forgekit.Bf16Activations")
    def rewrite(mod: Any, _ctx: Any) -> Any:
        return bf16_activations(mod, isa_info(target))

    return rewrite
