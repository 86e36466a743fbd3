"""Default CPU schedules for TVM 0.27 Relax modules, applied without any measurement.

TVM 0.27's default Relax CPU pipeline fuses operators but never schedules their loops, so its output
runs 10-40x slower than onnxruntime.  This package is the CPU counterpart of ``tvm.s_tir.dlight``: a
Relax prefix (numpy constant folding, batch-norm folding, NHWC layout, weights packed at compile time,
polynomial ``exp``/``erf``/``tanh``) and then schedule *rules* keyed by operator pattern
(``rules/``: conv2d, matmul, pool, row reductions, elementwise, a fallback) applied to every fused
PrimFunc, for the target's vector ISA (AVX-512, AVX2, NEON)::

    from forgekit import schedules
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    ex = tvm.compile(mod, target=target, relax_pipeline=schedules.cpu_pipeline(target))

Adding a rule is one file: a class with ``name``, ``matches(sch, tinfo)`` and ``apply(sch, match,
tinfo)`` inserted into :data:`RULES`.  ``FORGEKIT_SCHED_DEBUG=1`` prints the rule chosen for each
function (``=2`` adds the tracebacks of rules that failed).
"""
import tvm
from tvm import relax

from .registry import STATS, ApplyRules
from .fast_math import legalize_map
from .relax_passes import NumpyFoldConstant, preprocess, to_nhwc
from .rules import RULES
from .target_info import target_info

__all__ = ["cpu_pipeline", "build", "ApplyRules", "RULES", "preprocess", "target_info", "STATS"]


def _legalize_map(target, fast_math=True, pack_weights=True):
    from .packed_conv import make_conv2d_legalize, make_matmul_legalize
    m = {}
    if fast_math:
        m.update(legalize_map())
    if pack_weights:
        ti = target_info(target)
        m["relax.nn.conv2d"] = make_conv2d_legalize(ti)
        m["relax.matmul"] = make_matmul_legalize(ti)
        # integer conv2d/matmul from forgekit.quantize: VNNI / sdot kernels (see int8.py)
        from .int8 import make_conv2d_int8_legalize, make_matmul_int8_legalize
        m["relax.nn.conv2d"] = make_conv2d_int8_legalize(target, m["relax.nn.conv2d"])
        m["relax.matmul"] = make_matmul_int8_legalize(target, m["relax.matmul"])
    return m


def fusion_passes(target, use_nhwc=True, fast_math=True, pack_weights=True):
    """The pipeline up to fused, unscheduled PrimFuncs (what the rules and the tuner see)."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    T = relax.transform
    return [
        *cpu_generic.library_dispatch_passes(target),
        preprocess(use_nhwc),
        T.LegalizeOps(_legalize_map(target, fast_math, pack_weights)),
        T.AnnotateTIROpPattern(),
        T.FoldConstant(),
        T.FuseOps(),
        T.FuseTIR(),
    ]


def cpu_pipeline(target=None, use_nhwc=True, fast_math=True, pack_weights=True, database=None):
    """A Relax pipeline (tvm.transform.Pass) for `tvm.compile(..., relax_pipeline=...)`.

    Relax prefix (numpy constant folding, BN folding, NHWC/HWIO layout) -> legalize + fuse ->
    schedule rules on every fused PrimFunc (or the best tuning record in ``database``) -> the stock
    Relax CPU lowering passes.
    """
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    T = relax.transform

    @tvm.transform.module_pass(opt_level=0, name="forgekit.CpuPipeline")
    def _pipeline(mod, _ctx):
        tgt = target or tvm.target.Target.current(allow_none=False)
        seq = tvm.transform.Sequential([
            *fusion_passes(tgt, use_nhwc, fast_math, pack_weights),
            ApplyRules(tgt, database=database),
            *cpu_generic.dataflow_lower_passes(tgt),
            *cpu_generic.finalize_passes(tgt),
        ])
        with tgt:
            return seq(mod)

    return _pipeline


def build(mod, target, use_nhwc=True, fast_math=True, pack_weights=True):
    """Compile a Relax IRModule (e.g. from relax.frontend.onnx.from_onnx) to a relax.Executable."""
    target = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    return tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target, use_nhwc, fast_math, pack_weights))
