"""Which lowering pipeline a build uses: one per device kind, each the ``pipeline.py`` of its backend package
(:mod:`.cpu.pipeline`, :mod:`.cuda.pipeline`), where its whole pass order is written out phase by phase."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from ..options import GpuKernels, Precision

if TYPE_CHECKING:
    from ..targets import TargetSpec


def uses_cpu_schedules(opt_level: int, is_cpu: bool) -> bool:
    """Whether a build applies forgekit's CPU schedules (opt level 3 and up, LLVM targets)."""
    return opt_level >= 3 and is_cpu


def lowering_pipeline(spec: TargetSpec, target: Any, opt_level: int, *, precision: Precision = Precision.FP32,
                      database: Any = None, weights: Any = None, gpu_kernels: GpuKernels = GpuKernels.AUTO,
                      io: Any = None) -> Any:
    """The Relax->VM pipeline for ``spec`` (built as the ``tvm.target.Target`` ``target``) at ``opt_level``.

    ``database``: tuning records, ``weights``: a :class:`.cpu.weights.WeightStore` the large constants are lifted
    into (CPU targets at levels 3-4).  ``io``: a :class:`.cpu.io_buffers.IoPlan` a CPU build fills.
    ``gpu_kernels``: whose convolutions a CUDA target runs.  A target of another kind gets TVM's default pipeline
    (with fusion from level 2).
    """
    if spec.is_cpu:
        from .cpu.pipeline import lowering_pipeline as cpu

        return cpu(target, opt_level, precision=precision, database=database, weights=weights, io=io)
    if spec.is_cuda:
        from .cuda.pipeline import lowering_pipeline as cuda

        return cuda(target, opt_level, kernels=gpu_kernels, host_arch=spec.arch)
    from tvm import relax

    return relax.get_default_pipeline(target) if opt_level >= 2 else relax.get_pipeline("default_build")


def tir_pipeline(spec: TargetSpec) -> str:
    """The TIR pipeline ``tvm.compile`` runs for ``spec``: CPU targets keep register tiles of up to 2 KB on the stack
    (:mod:`.cpu.stack_tiles`), other kinds get TVM's default."""
    if spec.is_cpu:
        from .cpu.stack_tiles import tir_pipeline as cpu

        return cpu()
    return "default"


def build_scope(spec: TargetSpec, opt_level: int) -> Any:
    """What a build of ``spec`` runs inside: CUDA's nvcc callback (:func:`.cuda.pipeline.build_scope`), else
    nothing."""
    if spec.is_cuda:
        from .cuda.pipeline import build_scope as cuda

        return cuda(spec.cuda_arch, opt_level)
    return contextlib.nullcontext()
