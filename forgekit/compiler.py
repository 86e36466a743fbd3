"""``compile_model``: a Relax module + its description + :class:`~forgekit.options.CompileOptions` → an
artifact directory (library + metadata), written atomically.

The target goes options → :func:`~forgekit.targets.parse_target` (once, here) → build → backend →
link (:mod:`forgekit.backends.link`) → artifact.  Everything is written into a temporary sibling that is renamed into place at the end
(:mod:`forgekit.artifact.outputs`), so a failed compile never leaves a half-written ``output_path``,
and an existing one is replaced only when it is a forgekit artifact and ``force`` is set.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .artifact.layout import RECORDS_DIR
from .artifact.outputs import atomic_directory, check_output, check_space
from .artifact.writer import CompileResult, write_artifact
from .backends.cpu.io_buffers import IoPlan
from .backends.link import link_levels, linker
from .build import BuildReport, TuningSetup, build_executables
from .errors import UsageError
from .options import CompileOptions, TuneOptions
from .targets import parse_target
from .targets.variants import Variant, best_here, model_variants

if TYPE_CHECKING:
    from .description import ModelDescription
    from .targets import TargetSpec

__all__ = ["CompileResult", "compile_model"]


def compile_model(mod: Any, model: ModelDescription, options: CompileOptions, *,
                  ir_text: Callable[[], str] | None = None,
                  tuning_progress: Callable[[int, int, str], None] | None = None) -> CompileResult:
    """Compile the Relax module ``mod`` for ``options.target`` into ``options.output_path``.

    ``model`` says what the metadata records about the model; ``ir_text`` gives the IR as TVMScript when
    ``options.export_ir``; ``tuning_progress(done, total, note)`` is called after each tuning measurement.
    See :meth:`forgekit.IRModule.compile` for the options.
    """
    spec = parse_target(options.target, options.host)
    output = Path(options.output_path)
    check_output(output, force=options.force, kind="artifact", inputs=options.inputs)
    check_space(output.absolute(), model.weight_bytes)
    fcompile = linker(spec)  # fails fast, before a long build, when a toolchain is missing
    levels = model_variants(spec, model.quantization, model.operators)
    tuned = _tuned_level(spec, levels) if options.tuning is not None else 0

    start = time.perf_counter()
    report = BuildReport(options.opt_level)
    with contextlib.ExitStack() as stack:
        tuning, staging = None, None
        if options.tuning is not None:
            tuning, staging = _tuning_setup(stack, levels[tuned].spec, output, options.tuning, fcompile,
                                            tuning_progress)
        built = build_executables(mod, [v.spec for v in levels], labels=[v.name or v.spec.name for v in levels],
                                  opt_level=options.opt_level,
                                  precision=options.precision, layout=options.layout, gpu_kernels=options.gpu_kernels,
                                  report=report, tuning=tuning,
                                  tuned=tuned, external_weights=True)
        if report.tuning is not None and levels[tuned].name:
            report.tuning["level"] = levels[tuned].name  # the other levels keep forgekit's default schedules
        executables = list(zip(levels, built))
        if tuning is not None and tuning.measure is not None and report.tuning is not None:
            report.tuning["measured_on"] = tuning.measure.config.describe()  # records provenance: which board
        with atomic_directory(output, options.force, kind="artifact", inputs=options.inputs) as tmp:
            text = ir_text() if options.export_ir and ir_text is not None else None
            t_export = time.perf_counter()
            linked = link_levels(tmp, executables, spec, fcompile, options.opt_level,
                                 shared_weights=options.encrypt_password is None)
            report.seconds["export"] = round(time.perf_counter() - t_export, 3)
            io = IoPlan.of_levels([b.io for b in built])
            return write_artifact(tmp, output.absolute(), linked, spec, model, options, report, start,
                                  ir_text=text, records=staging, io=io.to_metadata() if io is not None else None)
    raise AssertionError("unreachable")  # pragma: no cover


def _tuned_level(spec: TargetSpec, levels: list[Variant]) -> int:
    """Which level of a portable target tuning measures: the best this machine runs (the others keep the
    default schedules).  Tuning over RPC, or for levels this CPU cannot run, needs a single-ISA target."""
    if len(levels) == 1:
        return 0
    best = None if spec.is_cross else best_here(levels)
    if best is None:
        raise UsageError(f"Tuning times kernels on one CPU, and this machine runs none of the levels of "
                         f"'{spec.name}': tune a single-ISA target (a tag such as x86/znver4) on such a CPU.")
    return best


def _tuning_setup(stack: contextlib.ExitStack, spec: TargetSpec, output: Path, tune: TuneOptions, fcompile: Any,
                  progress: Callable[[int, int, str], None] | None) -> tuple[TuningSetup, Path]:
    """Record folders for a tuning build (a staging copy of the artifact's own records, resumed from an
    existing output, and the shared cache) and how candidates are timed."""
    from .tuning.records import default_records_dir, target_key

    staging = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="forgekit-records-"))) / RECORDS_DIR
    previous = output.absolute() / RECORDS_DIR
    if previous.is_dir():
        shutil.copytree(previous, staging)
    else:
        staging.mkdir()
    folders = [staging]
    if tune.records is not False:
        base = Path(tune.records) if tune.records not in (None, True) else default_records_dir()
        folders.append(base / target_key(spec.tvm_target()))
    return TuningSetup(tune.trials, folders, progress, _measure(stack, spec, fcompile, tune)), staging


def _measure(stack: contextlib.ExitStack, spec: TargetSpec, fcompile: Any, tune: TuneOptions) -> Any:
    """How tuning times candidates: on this machine, or on an RPC device (required for a cross target,
    whose code cannot run here)."""
    if not tune.trials:
        return None  # records only: nothing is measured
    if tune.rpc is None:
        if spec.is_cross:
            raise UsageError(f"Tuning '{spec.name}' ({spec.arch}) measures kernels on such a CPU: give a board with "
                             "--rpc-tracker HOST:PORT --rpc-key KEY (or --rpc-host HOST:PORT), or --tune-trials 0.")
        return None
    from .tuning.remote import RemoteMeasure

    return stack.enter_context(RemoteMeasure(tune.rpc, spec.arch, fcompile))
