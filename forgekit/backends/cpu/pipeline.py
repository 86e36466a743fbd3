"""The CPU backend's lowering, in the order it runs: every pass a CPU build applies after forgekit's graph passes.

:func:`forgekit.build.build_executables` runs the graph passes (:func:`forgekit.passes.graph_passes`: names as C
identifiers, folding, batch-norm folding, mixed precision, layout) once per model, then this pipeline once per
target (each level of a portable target)::

    phase 0  index checks              every gather/scatter index a model reads from its inputs, bounds-checked
             -- levels 0-2: TVM's pipeline (default_build; from level 2 with fusion) --
    phase 1  library dispatch          TVM's CPU library offloads
    phase 2  Relax prefix              canonical forms, numpy folding, 1-D and transposed convs as 2-D convs, NHWC
    phase 3  bf16 activations          bf16 tensors between bf16 convolutions (Precision.BF16 only)
    phase 4  legalize                  packed, int8 and bf16 conv2d/matmul kernels, polynomial exp/erf/tanh
    phase 5  fuse                      run-time epilogue vectors kept apart, FuseOps, FuseTIR: what the rules see
    phase 6  schedule                  forgekit's rules (or the best tuning record) on every fused kernel
    phase 7  lift weights              large constants into the library's read-only data (artifact builds)
    phase 8  lower                     TVM's CPU dataflow lowering and finalization
    -- every level --
    phase 9  I/O buffers               kernels read inputs at any address, owned outputs found (io_buffers.py)

Batch norms are folded once, by the graph passes (``forgekit.FoldBatchNorm``, level 2): forgekit's pattern takes
the convolution bias ONNX exporters put between conv and norm, which TVM's ``FoldBatchnormToConv2D`` (once also
in phase 2) does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...options import Precision

if TYPE_CHECKING:
    from .io_buffers import IoPlan
    from .registry import RecordQuery
    from .weights import WeightStore


@dataclass(frozen=True)
class CpuLowering:
    """What the phases read besides the module: ``target`` (None: the one in scope), the precision, tuning
    records (``database``), a :class:`~.weights.WeightStore` to lift constants into, and the switches tests use."""

    target: Any = None
    precision: Precision = Precision.FP32
    database: RecordQuery | None = None
    weights: WeightStore | None = None
    use_nhwc: bool = True
    fast_math: bool = True
    pack_weights: bool = True


def lowering_pipeline(target: Any, opt_level: int, *, precision: Precision = Precision.FP32,
                      database: RecordQuery | None = None, weights: WeightStore | None = None,
                      io: IoPlan | None = None) -> Any:
    """The Relax->VM pipeline of a CPU target at ``opt_level``: phase 0, then TVM's pipeline below level 3
    (without it, TVM's CPU output is 10-40x slower than onnxruntime) or phases 1-8, then phase 9 (which fills
    ``io``)."""
    import tvm
    from tvm import relax

    from ...passes.index_checks import check_indices_pass
    from .io_buffers import io_buffers_pass

    if opt_level >= 3:
        pipeline = scheduled_pipeline(CpuLowering(target, Precision(precision), database, weights))
    elif opt_level == 2:
        pipeline = relax.get_default_pipeline(target)
    else:
        pipeline = relax.get_pipeline("default_build")
    return tvm.transform.Sequential([check_indices_pass(), pipeline, io_buffers_pass(io)],
                                    name="forgekit.CheckedPipeline")


def cpu_pipeline(target: Any = None, use_nhwc: bool = True, fast_math: bool = True, pack_weights: bool = True,
                 database: RecordQuery | None = None, bf16: bool = False, weights: WeightStore | None = None) -> Any:
    """:func:`scheduled_pipeline` from loose arguments, for ``tvm.compile(mod, target=target,
    relax_pipeline=cpu_pipeline(target))`` (``bf16``: :attr:`Precision.BF16`)."""
    return scheduled_pipeline(CpuLowering(target, Precision.BF16 if bf16 else Precision.FP32, database, weights,
                                          use_nhwc, fast_math, pack_weights))


def scheduled_pipeline(build: CpuLowering) -> Any:
    """Phases 1-8 as one pass."""
    import tvm
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    from .registry import ApplyRules
    from .serial_when_small import serial_when_small

    @tvm.transform.module_pass(opt_level=0, name="forgekit.CpuPipeline")
    def _pipeline(mod: Any, _ctx: Any) -> Any:
        tgt = build.target or tvm.target.Target.current(allow_none=False)
        seq = tvm.transform.Sequential([
            *_fusion_phases(build, tgt),                                              # phases 1-5
            ApplyRules(tgt, database=build.database), serial_when_small(),            # phase 6
            *([build.weights.lift_pass()] if build.weights is not None else []),      # phase 7
            *cpu_generic.dataflow_lower_passes(tgt), *cpu_generic.finalize_passes(tgt),  # phase 8
        ])
        with tgt:
            return seq(mod)

    return _pipeline


def fusion_passes(target: Any, use_nhwc: bool = True, fast_math: bool = True, pack_weights: bool = True,
                  bf16: bool = False, *, precision: Precision | None = None) -> list[Any]:
    """Phases 1-5: the pipeline up to fused, unscheduled PrimFuncs (what the rules and the tuner see)."""
    chosen = precision if precision is not None else Precision.BF16 if bf16 else Precision.FP32
    return _fusion_phases(CpuLowering(target, chosen, None, None, use_nhwc, fast_math, pack_weights), target)


def _fusion_phases(build: CpuLowering, target: Any) -> list[Any]:
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    from .epilogue_operands import keep_epilogue_operands_apart

    T = relax.transform
    rounded = []
    if build.precision is Precision.BF16 and build.use_nhwc and build.pack_weights:  # see bf16_activations.py
        from .bf16_activations import bf16_activations_pass

        rounded = [bf16_activations_pass(target)]
    return [
        *cpu_generic.library_dispatch_passes(target),                                  # phase 1
        preprocess(build.use_nhwc),                                                    # phase 2
        *rounded,                                                                      # phase 3
        T.LegalizeOps(legalize_map(target, build)), T.AnnotateTIROpPattern(), T.FoldConstant(),  # phase 4
        keep_epilogue_operands_apart(), T.FuseOps(), T.FuseTIR(),                      # phase 5
    ]


def preprocess(use_nhwc: bool = True) -> Any:
    """Phase 2, the Relax prefix: canonicalize, fold constants (numpy), 1-D convolutions as 2-D ones of height 1
    (:mod:`forgekit.passes.conv1d`), transposed convolutions as one convolution per output phase
    (:mod:`forgekit.passes.conv_transpose`), NHWC.  Both rewrites come before NHWC, which then converts the
    convolutions they make, and before phase 4, whose packed, bf16, int8 and Winograd legalizations take
    conv2d only."""
    import tvm

    from ...passes.canonicalize import Canonicalize
    from ...passes.conv1d import conv1d_as_conv2d_pass
    from ...passes.conv_transpose import conv_transpose_as_conv_pass
    from ...passes.layout import to_nhwc_or_keep
    from ...passes.numpy_fold import NumpyFoldConstant
    from ...passes.quantize_layout import quantize_keeps_layout_pass

    seq = [Canonicalize, NumpyFoldConstant, conv1d_as_conv2d_pass(), conv_transpose_as_conv_pass()]
    if use_nhwc:
        seq += [to_nhwc_or_keep(), quantize_keeps_layout_pass(), NumpyFoldConstant]
    return tvm.transform.Sequential(seq, name="forgekit.CpuPreprocess")


def legalize_map(target: Any, build: CpuLowering) -> dict[str, Any]:
    """Phase 4's custom legalizations: polynomial exp/erf/tanh (``fast_math``); conv2d and matmul with packed
    weights (``pack_weights``), in bf16 for :attr:`Precision.BF16` (:mod:`.bf16`), integer ones from
    :mod:`forgekit.quantize` on VNNI / sdot kernels (:mod:`.int8`)."""
    from ...targets.isa import isa_info
    from .bf16 import make_conv2d_bf16_legalize, make_matmul_bf16_legalize
    from .fast_math import legalize_map as fast_math_map
    from .fast_math import legalize_round
    from .int8 import make_conv2d_int8_legalize, make_matmul_int8_legalize
    from .packed_conv import make_conv2d_legalize, make_matmul_legalize
    from .views import legalize_reshape

    # symbolic reshapes stay views (views.py); round as a vectorizable intrinsic call (fast_math.legalize_round)
    m: dict[str, Any] = {"relax.reshape": legalize_reshape, "relax.round": legalize_round}
    if build.fast_math:
        m.update(fast_math_map())
    if build.pack_weights:
        isa = isa_info(target)
        conv, matmul = make_conv2d_legalize(isa), make_matmul_legalize(isa)
        if build.precision is Precision.BF16:  # fp32 conv2d/matmul with constant weights in bf16, the rest as before
            conv, matmul = make_conv2d_bf16_legalize(target, conv), make_matmul_bf16_legalize(target, matmul)
        m["relax.nn.conv2d"] = make_conv2d_int8_legalize(target, conv)
        m["relax.matmul"] = make_matmul_int8_legalize(target, matmul)
    return m
