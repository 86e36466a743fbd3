"""CUDA lowering pipelines that TVM does not provide as such."""

from __future__ import annotations

from typing import Any


def unfused_pipeline(target: Any) -> Any:
    """TVM's CUDA pipeline without FuseOps/FuseTIR (levels 0-1 on GPUs).

    ``default_build`` schedules nothing, so on a GPU target every kernel would stay a host loop nest
    that reads device memory; DLight's default GPU rules bind each operator to blocks and threads.
    """
    import tvm
    from tvm.relax.backend.cuda import pipeline as cuda

    legalize = [p for p in cuda.legalize_passes(target) if p.info.name not in ("FuseOps", "FuseTIR")]

    @tvm.transform.module_pass(opt_level=0, name="ForgekitGpuUnfused")
    def unfused(mod: Any, _ctx: Any) -> Any:
        with target:
            passes = (cuda.library_dispatch_passes(target) + legalize + cuda.dataflow_lower_passes(target)
                      + cuda.finalize_passes(target))
            return tvm.transform.Sequential(passes)(mod)

    return unfused
