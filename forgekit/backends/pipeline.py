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

    CPU pipelines at every level start with :func:`forgekit.passes.index_checks.check_indices_pass`: an index
    a model reads from its inputs is bounds-checked before any gather or scatter uses it.
    """
    import tvm
    from tvm import relax

    if uses_cpu_schedules(opt_level, is_cpu):
        from .cpu import cpu_pipeline

        pipeline = cpu_pipeline(target, database=database, bf16=bf16, weights=weights)
    elif opt_level >= 2:
        pipeline = relax.get_default_pipeline(target)
    elif is_cuda:
        from .cuda.pipeline import unfused_pipeline

        return unfused_pipeline(target)
    else:
        pipeline = relax.get_pipeline("default_build")
    if not is_cpu:
        return pipeline
    from ..passes.index_checks import check_indices_pass

    return tvm.transform.Sequential([check_indices_pass(), pipeline], name="forgekit.CheckedPipeline")
