"""The CPU backend: forgekit's default schedules for TVM 0.27 Relax modules, applied without measuring.

TVM 0.27's default Relax CPU pipeline fuses operators but never schedules their loops, so its output runs
10-40x slower than onnxruntime.  This package is the CPU counterpart of ``tvm.s_tir.dlight``: a Relax
prefix (canonicalization, numpy constant folding, batch-norm folding, NHWC layout: :mod:`forgekit.passes`),
weights packed at compile time and polynomial ``exp``/``erf``/``tanh`` (:mod:`.packed_conv`, :mod:`.int8`,
:mod:`.fast_math`), then schedule *rules* (:mod:`.rules`: conv2d, matmul, int8 dot products, pool, row
reductions, elementwise, a fallback) applied to every fused PrimFunc for the target's vector ISA::

    from forgekit.backends import cpu
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    ex = tvm.compile(mod, target=target, relax_pipeline=cpu.cpu_pipeline(target))

Adding a rule is one file: a :class:`~.rules.base.ScheduleRule` subclass inserted into
:data:`~.rules.RULES`.  ``FORGEKIT_SCHED_DEBUG=1`` logs the rule chosen for each function.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .registry import RecordQuery
    from .weights import WeightStore

__all__ = ["ApplyRules", "RULES", "STATS", "cpu_pipeline", "fusion_passes", "preprocess"]
_LAZY = {"ApplyRules": ".registry", "STATS": ".registry", "RULES": ".rules"}


def __getattr__(name: str) -> Any:
    """The rule registry and its pass, loaded (with TVM) on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'forgekit.backends.cpu' has no attribute '{name}'")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)


def _legalize_map(target: Any, fast_math: bool = True, pack_weights: bool = True,
                  bf16: bool = False) -> dict[str, Any]:
    from ...targets.isa import isa_info
    from .bf16 import make_conv2d_bf16_legalize, make_matmul_bf16_legalize
    from .fast_math import legalize_map
    from .int8 import make_conv2d_int8_legalize, make_matmul_int8_legalize
    from .packed_conv import make_conv2d_legalize, make_matmul_legalize

    m: dict[str, Any] = {}
    if fast_math:
        m.update(legalize_map())
    if pack_weights:
        isa = isa_info(target)
        # integer conv2d/matmul from forgekit.quantize: VNNI / sdot kernels (see int8.py), float ones packed
        conv, matmul = make_conv2d_legalize(isa), make_matmul_legalize(isa)
        if bf16:  # fp32 conv2d/matmul with constant weights in bf16 (see bf16.py), the rest as before
            conv, matmul = make_conv2d_bf16_legalize(target, conv), make_matmul_bf16_legalize(target, matmul)
        m["relax.nn.conv2d"] = make_conv2d_int8_legalize(target, conv)
        m["relax.matmul"] = make_matmul_int8_legalize(target, matmul)
    return m


def preprocess(use_nhwc: bool = True) -> Any:
    """The Relax-level prefix: canonicalize, fold constants (numpy), fold batch-norms, stride-sized transposed
    convolutions as 1x1 convolutions, NHWC."""
    import tvm
    from tvm import relax

    from ...passes.canonicalize import Canonicalize
    from ...passes.conv_transpose import conv_transpose_as_conv_pass
    from ...passes.layout import to_nhwc_or_keep
    from ...passes.numpy_fold import NumpyFoldConstant

    seq = [Canonicalize, NumpyFoldConstant, relax.transform.FoldBatchnormToConv2D(), NumpyFoldConstant,
           conv_transpose_as_conv_pass()]
    if use_nhwc:
        seq += [to_nhwc_or_keep(), NumpyFoldConstant]
    return tvm.transform.Sequential(seq, name="forgekit.CpuPreprocess")


def fusion_passes(target: Any, use_nhwc: bool = True, fast_math: bool = True, pack_weights: bool = True,
                  bf16: bool = False) -> list[Any]:
    """The pipeline up to fused, unscheduled PrimFuncs (what the rules and the tuner see); ``bf16``: conv2d and
    matmul in bf16 (:mod:`.bf16`, targets with AVX512_BF16)."""
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    T = relax.transform
    rounded = []
    if bf16 and use_nhwc and pack_weights:  # bf16 tensors between the bf16 convs (see bf16_activations.py)
        from .bf16_activations import bf16_activations_pass

        rounded = [bf16_activations_pass(target)]
    return [
        *cpu_generic.library_dispatch_passes(target),
        preprocess(use_nhwc),
        *rounded,
        T.LegalizeOps(_legalize_map(target, fast_math, pack_weights, bf16)),
        T.AnnotateTIROpPattern(),
        T.FoldConstant(),
        T.FuseOps(),
        T.FuseTIR(),
    ]


def cpu_pipeline(target: Any = None, use_nhwc: bool = True, fast_math: bool = True, pack_weights: bool = True,
                 database: RecordQuery | None = None, bf16: bool = False, weights: WeightStore | None = None) -> Any:
    """A Relax pipeline (a ``tvm.transform.Pass``) for ``tvm.compile(..., relax_pipeline=...)``.

    Relax prefix -> legalize + fuse -> schedule rules on every fused PrimFunc (or the best tuning record in
    ``database``) -> the stock Relax CPU lowering passes.  ``weights``: lift the large constants into it
    (:mod:`.weights`; the executable then needs the library that :meth:`WeightStore.sources` completes).
    """
    import tvm
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    from .registry import ApplyRules
    from .serial_when_small import serial_when_small

    @tvm.transform.module_pass(opt_level=0, name="forgekit.CpuPipeline")
    def _pipeline(mod: Any, _ctx: Any) -> Any:
        tgt = target or tvm.target.Target.current(allow_none=False)
        seq = tvm.transform.Sequential([
            *fusion_passes(tgt, use_nhwc, fast_math, pack_weights, bf16),
            ApplyRules(tgt, database=database),
            serial_when_small(),
            *([weights.lift_pass()] if weights is not None else []),
            *cpu_generic.dataflow_lower_passes(tgt),
            *cpu_generic.finalize_passes(tgt),
        ])
        with tgt:
            return seq(mod)

    return _pipeline
