"""Which lowering pipeline a build uses, by target kind and opt level."""

from __future__ import annotations

from typing import Any


def uses_cpu_schedules(opt_level: int, is_cpu: bool) -> bool:
    """Whether a build applies forgekit's CPU schedules (opt level 3 and up, LLVM targets)."""
    return opt_level >= 3 and is_cpu


def lowering_pipeline(opt_level: int, target: Any, *, is_cpu: bool, is_cuda: bool, database: Any = None,
                      bf16: bool = False, weights: Any = None) -> Any:
    """The Relax->VM pipeline for ``target`` at ``opt_level``.

    CPU from level 3: :func:`.cpu.cpu_pipeline` (NHWC, packed weights and a scheduled loop nest for every
    fused kernel; without it TVM's CPU output is 10-40x slower than onnxruntime), with tuning records
    from ``database``; ``bf16``: conv2d/matmul in bf16 (:mod:`.cpu.bf16`); ``weights``: a
    :class:`.cpu.weights.WeightStore` the large constants are lifted into (CPU levels 3-4 only).  Level 2
    (and GPUs): TVM's default pipeline with fusion (DLight on GPUs).  Below: unfused (on GPUs still DLight-scheduled,
    :func:`.cuda.pipeline.unfused_pipeline`).
    """
    from tvm import relax

    if uses_cpu_schedules(opt_level, is_cpu):
        from .cpu import cpu_pipeline

        return cpu_pipeline(target, database=database, bf16=bf16, weights=weights)
    if opt_level >= 2:
        return relax.get_default_pipeline(target)
    if is_cuda:
        from .cuda.pipeline import unfused_pipeline

        return unfused_pipeline(target)
    return relax.get_pipeline("default_build")
