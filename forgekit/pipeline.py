"""Compilation stages: graph-level presets per ``opt_level`` and the build into an executable.

Each stage is a plain function; :data:`OPT_LEVELS` documents what every level runs (the ``-O`` flags of
TVM's own Relax passes are nearly all registered at level 0, so a PassContext opt_level alone changes
almost nothing — forgekit builds its presets from explicit pass lists instead):

====  =====================================================================================
 0    Legalize and build operator by operator: no folding, no fusion (for debugging).
 1    + constant folding, common-subexpression and dead-code elimination, binding cleanup.
 2    + operator fusion (FuseOps/FuseTIR), batch-norm folding into convolutions.
 3    + transpose-into-matmul fusion, merging of parallel matmuls, and on CPUs forgekit's default
      schedules (:mod:`forgekit.schedules`: NHWC, packed weights, vectorized and parallel loop nests,
      polynomial exp/erf/tanh) (default).
 4    + LLVM fast-math (reassociation, contraction): faster reductions, results may differ in
      the last bits.
====  =====================================================================================
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import CompileError, ForgekitError, UsageError

if TYPE_CHECKING:
    from .ir import IRModule
    from .targets import TargetSpec

OPT_LEVELS: dict[int, str] = {
    0: "legalize and build each operator; no folding or fusion",
    1: "constant folding, CSE, dead-code elimination",
    2: "level 1 + operator fusion + batch-norm folding",
    3: "level 2 + matmul rewrites + target schedules",
    4: "level 3 + LLVM fast-math",
}

#: ``set_channel_layout`` value -> ConvertLayout request (data layout, kernel layout)
LAYOUTS: dict[str, tuple[str, str] | None] = {
    "first": None,  # ONNX is channels-first already
    "nchw": None,
    "last": ("NHWC", "OHWI"),
    "nhwc": ("NHWC", "OHWI"),
}


@dataclass
class TuningConfig:
    """Tuning requested for a build (see :mod:`forgekit.tuning`).

    ``trials`` new measurements (0: only reuse records); records are read from and appended to every
    folder of ``folders`` (the artifact's ``optimization_artifacts`` and the shared cache).
    """

    trials: int
    folders: list[Any]
    progress: Any = None
    #: times one candidate (default: on this machine; see :class:`forgekit.remote_tuning.RemoteMeasure`)
    measure: Any = None


@dataclass
class BuildReport:
    """What the build did, for ``compile_report.json``."""

    opt_level: int
    passes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    #: fused kernel name -> schedule rule that scheduled it (CPU targets, opt_level >= 3)
    schedule_rules: dict[str, str] = field(default_factory=dict)
    #: what tuning did (tasks, trials, seconds, records, per-kernel speed-up over the default)
    tuning: dict[str, Any] | None = None


def normalize_layout(layout: str | None) -> str | None:
    """Map ``first``/``last``/``NCHW``/``NHWC`` (any case) to ``"first"``/``"last"`` or None."""
    if layout is None:
        return None
    key = str(layout).lower()
    if key not in LAYOUTS:
        raise UsageError(f"Unknown channel layout '{layout}': use first, last, NCHW or NHWC.")
    return "last" if LAYOUTS[key] else "first"


def has_op(mod: Any, op_name: str) -> bool:
    """Whether any Relax function of ``mod`` calls the operator ``op_name`` (e.g. ``relax.nn.conv2d``)."""
    import tvm
    from tvm import relax

    found = []

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == op_name:
            found.append(expr)

    for _gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def fold_batch_norms(mod: Any) -> Any:
    """Fold inference batch-norms into the preceding convolution: ``conv(x, W) [+ b] → bn`` becomes
    ``conv(x, W * s) + ((b - mean) * s + beta)`` with ``s = gamma / sqrt(var + eps)``.

    TVM's ``FoldBatchnormToConv2D`` only matches a batch-norm directly after the convolution, but ONNX
    exporters put the convolution bias in between, so forgekit folds with its own pattern (in float64,
    on constants only, NCHW/OIHW only).  Unmatched batch-norms are decomposed at build time.
    """
    import numpy as np
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, is_tuple_get_item, rewrite_call, wildcard

    data, weight, bias = wildcard(), is_const(), is_const()
    gamma, beta, mean, var = is_const(), is_const(), is_const(), is_const()
    conv = is_op("relax.nn.conv2d")(data, weight)
    norm = is_op("relax.nn.batch_norm")(is_op("relax.add")(conv, bias) | conv, gamma, beta, mean, var)
    pattern = is_tuple_get_item(norm, 0)

    def rewrite(expr: Any, matched: Any) -> Any:
        call, bn = matched[conv], matched[norm]
        attrs, bn_attrs = call.attrs, bn.attrs
        if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW" or int(bn_attrs.axis) != 1:
            return expr
        w = matched[weight].value.numpy()
        channels = w.shape[0]
        b = matched[bias].value.numpy() if bias in matched else np.zeros(channels, w.dtype)
        if b.size != channels:
            return expr
        g, bt, mu, v = (matched[p].value.numpy().astype(np.float64) for p in (gamma, beta, mean, var))
        scale = g / np.sqrt(v + float(bn_attrs.epsilon))
        new_w = (w.astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype(w.dtype)
        new_b = ((b.reshape(-1).astype(np.float64) - mu) * scale + bt).astype(w.dtype).reshape(1, -1, 1, 1)
        folded = relax.op.nn.conv2d(call.args[0], relax.const(new_w), strides=attrs.strides, padding=attrs.padding,
                                    dilation=attrs.dilation, groups=attrs.groups, data_layout=attrs.data_layout,
                                    kernel_layout=attrs.kernel_layout, out_layout=attrs.out_layout,
                                    out_dtype=attrs.out_dtype)
        return relax.op.add(folded, relax.const(new_b))

    if not has_op(mod, "relax.nn.batch_norm"):
        return mod
    import tvm

    functions = {gv: rewrite_call(pattern, rewrite, func) if isinstance(func, relax.Function) else func
                 for gv, func in mod.functions.items()}
    return tvm.IRModule(functions, attrs=mod.attrs)  # a new module: callers keep theirs unchanged


def _fold_batch_norms_pass() -> Any:
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="ForgekitFoldBatchNorm")
    def fold(mod: Any, _ctx: Any) -> Any:
        return fold_batch_norms(mod)

    return fold


def graph_passes(opt_level: int, *, float16: bool = False, layout: str | None = None) -> list[Any]:
    """Relax-to-Relax passes that run before lowering, for ``opt_level``."""
    from tvm import relax

    T = relax.transform
    passes: list[Any] = [T.DecomposeOpsForInference()]
    if opt_level >= 1:
        passes += [T.FoldConstant(), T.CanonicalizeBindings(), T.EliminateCommonSubexpr(), T.DeadCodeElimination()]
    if opt_level >= 2:
        passes += [_fold_batch_norms_pass(), T.FoldConstant()]
    if opt_level >= 3:
        passes += [T.FuseTransposeMatmul(), T.CombineParallelMatmul(), T.FoldConstant()]
    if normalize_layout(layout) == "last":
        data, kernel = LAYOUTS["last"]  # type: ignore[misc]
        passes += [T.ConvertLayout({"relax.nn.conv2d": [data, kernel], "relax.nn.max_pool2d": [data],
                                    "relax.nn.avg_pool2d": [data], "relax.nn.adaptive_avg_pool2d": [data]}),
                   T.FoldConstant()]
    if float16:
        # Compute convolutions and matmuls in fp16 but accumulate in fp32: the error stays ~1e-3.
        passes += [T.ToMixedPrecision(out_dtype="float32"), T.FoldConstant()]
    return passes


def uses_cpu_schedules(opt_level: int, spec: TargetSpec) -> bool:
    """Whether the build applies forgekit's default CPU schedules (level 3 and up, LLVM targets)."""
    return opt_level >= 3 and spec.is_cpu


def lowering_pipeline(opt_level: int, target: Any, spec: TargetSpec | None = None) -> Any:
    """The Relax→VM pipeline.

    From level 3 on CPU targets: :func:`forgekit.schedules.cpu_pipeline` (NHWC, packed weights and a
    scheduled loop nest for every fused kernel — without it TVM's CPU output is 10-40x slower than
    onnxruntime).  Level 2 (and GPUs): TVM's default pipeline with fusion (DLight schedules on GPUs).
    Below: unfused (on GPUs still DLight-scheduled, see :func:`gpu_unfused_pipeline`).
    """
    from tvm import relax

    if spec is not None and uses_cpu_schedules(opt_level, spec):
        from . import schedules

        return schedules.cpu_pipeline(target)
    if opt_level >= 2:
        return relax.get_default_pipeline(target)
    if spec is not None and spec.kind == "cuda":
        return gpu_unfused_pipeline(target)
    return relax.get_pipeline("default_build")


def gpu_unfused_pipeline(target: Any) -> Any:
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


def tvm_target_for(spec: TargetSpec, opt_level: int) -> Any:
    """The ``tvm.target.Target`` to build with (level 4 turns on LLVM fast-math)."""
    if opt_level >= 4 and spec.is_cpu:
        from dataclasses import replace

        spec = replace(spec, target={**spec.target, "fast-math": True})
    return spec.tvm_target()


def _device_compiler(spec: TargetSpec, opt_level: int) -> Any:
    """CUDA targets: nvcc compiles the kernels while TVM builds (see :mod:`forgekit.nvcc`)."""
    import contextlib

    if spec.kind != "cuda":
        return contextlib.nullcontext()
    from . import nvcc
    from .targets.families.cuda import cuda_arch

    return nvcc.scoped_compile_callback(cuda_arch(spec), fast_math=opt_level >= 4)


def build_executable(ir: IRModule, spec: TargetSpec, *, opt_level: int = 3, float16: bool = False,
                     layout: str | None = None, report: BuildReport | None = None,
                     tuning: TuningConfig | None = None) -> Any:
    """Run the graph passes and the lowering pipeline; returns a ``tvm.relax.Executable``.

    With ``tuning`` (CPU targets, opt_level >= 3), the fused kernels' schedule knobs are measured first
    and the best records replace the default rules where they exist.
    """
    import tvm

    if opt_level not in OPT_LEVELS:
        raise UsageError(f"opt_level must be one of {sorted(OPT_LEVELS)}, got {opt_level!r}.")
    if tuning is not None and not uses_cpu_schedules(opt_level, spec):
        raise UsageError(f"Tuning needs a CPU target at opt_level 3 or 4 (got {spec.name} at level {opt_level}): "
                         "drop --tune-trials or change the target/level.")
    target = tvm_target_for(spec, opt_level)
    report = report or BuildReport(opt_level)
    passes = graph_passes(opt_level, float16=float16, layout=layout)
    report.passes = [p.info.name for p in passes]
    scheduled = uses_cpu_schedules(opt_level, spec)
    if scheduled:
        from . import schedules

        report.passes.append("forgekit.CpuSchedules")
        schedules.STATS.clear()
    try:
        start = time.perf_counter()
        mod = tvm.transform.Sequential(passes)(ir.mod)
        report.seconds["graph_passes"] = round(time.perf_counter() - start, 3)
        pipeline = lowering_pipeline(opt_level, target, spec)
        if tuning is not None:
            from . import schedules, tuning as tuner

            start = time.perf_counter()
            if tuning.trials > 0:
                with target:
                    fused = tvm.transform.Sequential(schedules.fusion_passes(target))(mod)
                summary = tuner.tune(fused, target, tuning.trials, tuning.folders, progress=tuning.progress,
                                     measure=tuning.measure)
                report.tuning = summary.to_dict()
                report.seconds["tuning"] = round(time.perf_counter() - start, 3)
            records = tuner.RecordSet(tuning.folders)
            report.tuning = {**(report.tuning or {"trials": 0}), "records_used": len(records)}
            pipeline = schedules.cpu_pipeline(target, database=records)
        start = time.perf_counter()
        with target, _device_compiler(spec, opt_level):
            executable = tvm.compile(mod, target=target, relax_pipeline=pipeline)
        report.seconds["lower_and_codegen"] = round(time.perf_counter() - start, 3)
        if scheduled:
            report.schedule_rules = dict(sorted(schedules.STATS.items()))
    except ForgekitError:
        raise
    except Exception as exc:
        from .frontend import _first_line

        raise CompileError(f"TVM failed to compile for {spec.name}: {_first_line(exc)}") from exc
    return executable
