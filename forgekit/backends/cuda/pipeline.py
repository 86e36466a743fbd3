"""The CUDA backend's lowering, in the order it runs (TVM's CUDA pipeline, spelled out so that every level is one
list): after forgekit's graph passes (:func:`forgekit.passes.graph_passes`, where ``Precision.FP16`` rewrites
convolutions and matmuls to fp16 with fp32 accumulation), once per target::

    phase 1  library dispatch          batched matmuls over a derived length as over a variable (:mod:`.gemm_extents`),
                                       transposed convolutions as convolutions, convolutions to cuDNN
                                       (:mod:`.cudnn`, ``--gpu-kernels``), matmuls to cuBLAS (:mod:`.cublas`,
                                       ``--gpu-kernels vendor``),
                                       then TVM's CUDA library offloads (none enabled by default)
    phase 2  legalize (+ fuse)         operators to TIR; FuseOps/FuseTIR from opt level 2 only
    phase 3  dataflow lowering         DLight's default GPU rules bind every kernel to blocks and threads
    phase 4  finalize                  VM code generation

``default_build`` (levels 0-1 elsewhere) schedules nothing, so on a GPU every kernel would stay a host loop
nest that reads device memory: the unfused levels drop only fusion.  While TVM builds, nvcc compiles the
kernels (:func:`build_scope`); at export they are packed as a fatbin (:mod:`.export`), and the cuDNN calls'
extension is compiled into the library when the executable makes any (:func:`.export.with_extensions`).
"""

from __future__ import annotations

import logging
from typing import Any

from ...errors import ToolchainError
from ...options import GpuKernels

log = logging.getLogger("forgekit.backends.cuda")


def uses_cudnn(kernels: GpuKernels, host_arch: str) -> bool:
    """Whether a build routes convolutions to cuDNN: ``cudnn`` needs NVIDIA's wheel here, for the artifact's
    host architecture (one line naming it, exit 10, otherwise); ``auto`` uses it when it is installed, ``tvm``
    never.  The wheel found is this machine's: a Jetson (aarch64) build cannot link it (x86-64 objects)."""
    from ...runtime.cpu import host_arch as this_arch
    from .cudnn import find_cudnn

    if kernels is GpuKernels.TVM:
        return False
    if host_arch != this_arch():
        if kernels in (GpuKernels.CUDNN, GpuKernels.VENDOR):
            raise ToolchainError(f"--gpu-kernels {kernels} links NVIDIA's cuDNN wheel of this {this_arch()} machine, "
                                 f"not one for {host_arch} hosts (Jetson): use --gpu-kernels tvm.")
        return False
    found = find_cudnn()
    if found is None and kernels in (GpuKernels.CUDNN, GpuKernels.VENDOR):
        raise ToolchainError("--gpu-kernels cudnn needs NVIDIA's cuDNN 9 headers and library: pip install "
                             "nvidia-cudnn-cu13 (or pip install 'forgekit[cuda]'), or use --gpu-kernels tvm.")
    return found is not None


def lowering_pipeline(target: Any, opt_level: int, kernels: GpuKernels = GpuKernels.AUTO,
                      host_arch: str = "x86_64") -> Any:
    """The Relax->VM pipeline of a CUDA target at ``opt_level``: phases 1-4 as one pass."""
    import tvm
    from tvm.relax.backend.cuda import pipeline as cuda

    legalize = [guarded_default_schedule() if p.info.name == "ApplyDefaultSchedule" else p
                for p in cuda.legalize_passes(target)]
    if opt_level < 2:
        legalize = [p for p in legalize if p.info.name not in ("FuseOps", "FuseTIR")]
    from .gemm_extents import plain_gemm_extents_pass

    vendor = [plain_gemm_extents_pass()]  # before any route: the matmuls are TVM's kernels either way
    if uses_cudnn(kernels, host_arch):
        from ...passes.conv_transpose import conv_transpose_as_conv_pass
        from .cudnn import route_convolutions_pass

        # transposed convolutions as convolutions first (forgekit.passes.conv_transpose), so cuDNN runs them too:
        # TVM's conv2d_transpose kernel was 50-59 % of PP-OCRv4 det's time at batch 32 on an H200 (14.8 ms)
        vendor += [conv_transpose_as_conv_pass(), route_convolutions_pass()]
    if kernels is GpuKernels.VENDOR:
        from .cublas import find_cublas, route_matmuls_pass

        if find_cublas() is None:
            raise ToolchainError("--gpu-kernels vendor needs NVIDIA's cuBLAS headers and library: pip install "
                                 "nvidia-cublas (or pip install 'forgekit[cuda]'), or use --gpu-kernels cudnn.")
        vendor.append(route_matmuls_pass())  # matmuls on cuBLAS (not yet measured on a GPU: not in auto)

    @tvm.transform.module_pass(opt_level=0, name="ForgekitGpuUnfused" if opt_level < 2 else "ForgekitCuda")
    def pipeline(mod: Any, _ctx: Any) -> Any:
        with target:
            return tvm.transform.Sequential([
                *vendor, *cuda.library_dispatch_passes(target),  # phase 1
                *legalize,                                       # phase 2
                *cuda.dataflow_lower_passes(target),             # phase 3
                *cuda.finalize_passes(target),                   # phase 4
            ])(mod)

    return pipeline


def guarded_default_schedule() -> Any:
    """TVM's default GPU schedule (DLight's Matmul, GEMV, Reduction, GeneralReduction and Fallback rules, in its
    order), where a rule that raises on a kernel passes it to the next rule instead of failing the build.

    DLight's GEMV rule took a depthwise conv1d's loop nest (and a depthwise conv2d of height 1) and asserted on
    it ("'Add' object has no attribute 'value'": a tile extent it expects to be the literal 1), so such a model
    did not build for CUDA with TVM's kernels; the reduction rules schedule it.  A rule returns None for what
    it does not take; raising is a rule's bug, not a verdict on the kernel."""
    from tvm.s_tir import dlight as dl

    class Guarded(dl.ScheduleRule):
        def __init__(self, rule: Any) -> None:
            self.rule = rule

        def apply(self, func: Any, target: Any, tunable: bool) -> Any:
            try:
                return self.rule.apply(func, target, tunable)
            except Exception as exc:  # noqa: BLE001 - any assertion inside a rule's analysis
                log.debug("DLight %s raised on a kernel (%s); trying the next rule", type(self.rule).__name__,
                          exc)
                return None

        def is_target_available(self, target: Any) -> bool:
            return self.rule.is_target_available(target)

    rules = (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback())
    return dl.ApplyDefaultSchedule(*(Guarded(rule) for rule in rules))


def unfused_pipeline(target: Any) -> Any:
    """Levels 0-1: :func:`lowering_pipeline` without FuseOps/FuseTIR."""
    return lowering_pipeline(target, 0)


def build_scope(arch: str, opt_level: int) -> Any:
    """The context a CUDA build runs in: nvcc compiles the kernels while TVM builds (with ``--use_fast_math`` at
    level 4; see :mod:`.nvcc`)."""
    from . import nvcc

    return nvcc.scoped_compile_callback(arch, fast_math=opt_level >= 4)
