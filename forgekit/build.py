"""Build: a Relax ``tvm.IRModule`` and a target spec in, a ``tvm.relax.Executable`` out.

graph passes for the opt level (:mod:`forgekit.passes`) -> optional tuning (:mod:`forgekit.tuning`) ->
the backend's lowering pipeline (:mod:`forgekit.backends`) -> codegen.  Plain data in and out: the
façade, calibration and the compiler all call :func:`build_executable` with a module they own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from . import interrupts, log, progress
from .errors import CompileError, ForgekitError, UsageError
from .options import GpuKernels, Precision
from .passes import OPT_LEVELS, graph_passes

if TYPE_CHECKING:
    from .targets import TargetSpec


@dataclass
class Lowered:
    """One target's executable and, when its constants were lifted out of it (artifact builds for CPUs at opt
    level 3-4, :mod:`forgekit.backends.cpu.weights`), the weights its library must embed."""

    executable: Any
    weights: Any = None  # a forgekit.backends.cpu.weights.WeightStore
    io: Any = None  # a forgekit.backends.cpu.io_buffers.IoPlan (CPU targets)


@dataclass
class TuningSetup:
    """Tuning requested for a build: ``trials`` new measurements (0: only reuse records) appended to every
    folder of ``folders`` (the artifact's ``optimization_artifacts`` and the shared cache)."""

    trials: int
    folders: list[Any]
    progress: Callable[[int, int, str], None] | None = None
    #: times one candidate (default: on this machine; see :class:`forgekit.tuning.remote.RemoteMeasure`)
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
    #: fused kernel name -> floating-point operations per call (static shapes), for GFLOP/s in profiles
    kernel_flops: dict[str, float] = field(default_factory=dict)
    #: per level of a portable build: {"schedule_rules", "kernel_flops"} of that level's kernels (the level a CPU
    #: loads need not be the first: bench --profile looks its kernels up here)
    levels: dict[str, dict[str, Any]] = field(default_factory=dict)


#: LLVM's fast-math flags of opt level 4: reassociation (vectorized reductions), contraction (FMA) and no
#: signed zeros, what levels 0-3 keep strict.  Not all of "fast-math": with it a YOLOv8n detector's (NudeNet
#: 320n) boxes moved by 0.11 px at a 320 px scale, where this level promises last-bit differences; bisected on
#: that model, the no-NaN/no-inf flags (nnan, ninf) move it, approximate reciprocals (arcp) do not.
FAST_MATH = {"fast-math-reassoc": True, "fast-math-contract": True, "fast-math-nsz": True}


def tvm_target_for(spec: TargetSpec, opt_level: int) -> Any:
    """The ``tvm.target.Target`` to build with (level 4 turns on LLVM fast-math)."""
    if opt_level >= 4 and spec.is_cpu:
        spec = replace(spec, target={**spec.target, **FAST_MATH})
    return spec.tvm_target()


def build_executable(mod: Any, spec: TargetSpec, *, opt_level: int = 3, precision: Precision | str = Precision.FP32,
                     layout: str | None = None, report: BuildReport | None = None,
                     tuning: TuningSetup | None = None) -> Any:
    """Run the graph passes and the lowering pipeline on ``mod``; returns a ``tvm.relax.Executable``.

    With ``tuning`` (CPU targets, opt_level >= 3), the fused kernels' schedule knobs are measured first
    and the best records replace the default rules where they exist.  TVM's own log lines are kept off
    the terminal (:mod:`forgekit.log`); any TVM failure is one :class:`CompileError` line.
    """
    return build_executables(mod, [spec], opt_level=opt_level, precision=precision, layout=layout, report=report,
                             tuning=tuning)[0].executable


def build_executables(mod: Any, specs: list[TargetSpec], *, opt_level: int = 3,
                      precision: Precision | str = Precision.FP32,
                      layout: str | None = None, gpu_kernels: GpuKernels | str = GpuKernels.AUTO,
                      report: BuildReport | None = None, tuning: TuningSetup | None = None, tuned: int = 0,
                      labels: list[str] | None = None, external_weights: bool = False) -> list[Lowered]:
    """:func:`build_executable` for several CPU targets of one model (the levels of a portable target): the
    graph passes run once (they do not depend on the target), the lowering and codegen once per target.
    ``tuning`` applies to ``specs[tuned]`` only (the level this machine runs and can measure).  ``report``
    gets the first target's schedule rules and the summed lowering time; ``labels`` name the targets in
    progress reports (the level names of a portable target).  ``external_weights``: lift the large constants
    out of CPU executables scheduled by forgekit (the library must then embed them: ``Lowered.weights``).
    ``precision``: any spelling of a :class:`~forgekit.options.Precision` (resolved here, once)."""
    import tvm

    from .backends.pipeline import uses_cpu_schedules

    if opt_level not in OPT_LEVELS:
        raise UsageError(f"opt_level must be one of {sorted(OPT_LEVELS)}, got {opt_level!r}.")
    first = specs[0]
    scheduled = uses_cpu_schedules(opt_level, first.is_cpu)
    if tuning is not None and not scheduled:
        raise UsageError(f"Tuning needs a CPU target at opt_level 3 or 4 (got {first.name} at level {opt_level}): "
                         "drop --tune-trials or change the target/level.")
    precision = Precision.parse(precision)
    gpu_kernels = GpuKernels.parse(gpu_kernels)
    if precision is Precision.BF16:
        check_bf16(specs, opt_level, scheduled)
    report = report or BuildReport(opt_level)
    passes = graph_passes(opt_level, precision=precision, layout=layout)
    report.passes = [p.info.name for p in passes] + (["forgekit.CpuSchedules"] if scheduled else [])
    executables = []
    try:
        with interrupts.watch(), log.quiet_native("compile"):
            start = time.perf_counter()
            progress.report("graph passes")
            mod = tvm.transform.Sequential(passes)(mod)
            report.seconds["graph_passes"] = round(time.perf_counter() - start, 3)
            for index, spec in enumerate(specs):
                label = labels[index] if labels else spec.name
                progress.report(f"lowering for {label}" + (f" ({index + 1} of {len(specs)})" if len(specs) > 1 else ""))
                executables.append(_lower(mod, spec, opt_level, precision, report, tuning if index == tuned else None,
                                          rules=index == 0, external_weights=external_weights,
                                          gpu_kernels=gpu_kernels))
                if len(specs) > 1 and labels and uses_cpu_schedules(opt_level, spec.is_cpu):
                    from .backends.cpu.registry import FLOPS, STATS

                    report.levels[label] = {"schedule_rules": dict(sorted(STATS.items())),
                                            "kernel_flops": dict(sorted(FLOPS.items()))}
    except ForgekitError:
        raise
    except Exception as exc:
        interrupts.check(exc)
        raise CompileError(f"TVM failed to compile for {first.name}: {log.first_line(exc)}{_hint(str(exc))}") from exc
    return executables


def check_bf16(specs: list[TargetSpec], opt_level: int, scheduled: bool) -> None:
    """bf16 is a kernel of forgekit's CPU schedules (opt level 3-4) for targets with AVX512_BF16: one line
    otherwise, before any work."""
    if not scheduled:
        raise UsageError(f"bf16 needs a CPU target at opt level 3 or 4 (got {specs[0].name} at level {opt_level}).")
    from .backends.cpu.bf16 import check_target

    for spec in specs:
        check_target(tvm_target_for(spec, opt_level), spec.name)


def _lower(mod: Any, spec: TargetSpec, opt_level: int, precision: Precision, report: BuildReport,
           tuning: TuningSetup | None, rules: bool, external_weights: bool = False,
           gpu_kernels: GpuKernels = GpuKernels.AUTO) -> Lowered:
    """The backend's lowering pipeline and codegen of a graph-optimised module for one target."""
    import tvm

    from .backends.pipeline import build_scope, lowering_pipeline, tir_pipeline, uses_cpu_schedules

    scheduled = uses_cpu_schedules(opt_level, spec.is_cpu)
    target = tvm_target_for(spec, opt_level)
    if scheduled:
        from .backends.cpu.registry import FLOPS, STATS

        STATS.clear()
        FLOPS.clear()
    database = _tune(mod, target, tuning, report, precision) if tuning is not None else None
    weights = None
    if scheduled and external_weights:
        from .backends.cpu.weights import WeightStore

        weights = WeightStore()
    io = None
    if spec.is_cpu:
        from .backends.cpu.io_buffers import IoPlan

        io = IoPlan()
    pipeline = lowering_pipeline(spec, target, opt_level, precision=precision, database=database, weights=weights,
                                 gpu_kernels=gpu_kernels, io=io)
    start = time.perf_counter()
    with target, build_scope(spec, opt_level):
        executable = tvm.compile(mod, target=target, relax_pipeline=pipeline, tir_pipeline=tir_pipeline(spec))
    report.seconds["lower_and_codegen"] = round(report.seconds.get("lower_and_codegen", 0.0)
                                                + time.perf_counter() - start, 3)
    if scheduled and rules:
        report.schedule_rules = dict(sorted(STATS.items()))
        report.kernel_flops = dict(sorted(FLOPS.items()))
    return Lowered(executable, weights if weights is not None and weights.arrays else None, io)


#: TVM messages that mean "a shape could not be resolved" -> what the user can do about it
_SHAPE_HINT = (" (an output shape depends on a dynamic dimension in a way TVM cannot resolve, e.g. x[..., -5:] "
               "on a length W: pin the dynamic inputs with --input-shape / shape_dict; forgekit inspect --check "
               "lists them)")


def _hint(message: str) -> str:
    return _SHAPE_HINT if "CodeGenVM cannot emit this Relax operator" in message else ""


def _tune(mod: Any, target: Any, tuning: TuningSetup, report: BuildReport, precision: Precision) -> Any:
    """Measure (when trials > 0) and return the records the CPU pipeline schedules with (the kernels the build of
    ``precision`` has: bf16 ones have no knobs and are not measured)."""
    import tvm

    from .backends.cpu.pipeline import fusion_passes
    from .tuning.records import RecordSet
    from .tuning.tuner import tune

    start = time.perf_counter()
    if tuning.trials > 0:
        with target:
            fused = tvm.transform.Sequential(fusion_passes(target, precision=precision))(mod)
        summary = tune(fused, target, tuning.trials, tuning.folders, progress=tuning.progress,
                       measure=tuning.measure)
        report.tuning = summary.to_dict()
        report.seconds["tuning"] = round(time.perf_counter() - start, 3)
    records = RecordSet(tuning.folders)
    report.tuning = {**(report.tuning or {"trials": 0}), "records_used": len(records)}
    return records
