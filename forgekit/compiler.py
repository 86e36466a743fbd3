"""``compile_model``: IRModule → artifact directory (library + metadata), written atomically.

Everything is written into a temporary sibling directory that is renamed into place at the end, so a
failed compile never leaves a half-written ``output_path`` behind, and an existing one is replaced only
with ``force_overwrite``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid as _uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from . import metadata as md
from .errors import CompileError, ForgekitError, OutputExistsError, UsageError
from .pipeline import BuildReport, build_executable, normalize_layout
from .targets import get_family, parse_target

if TYPE_CHECKING:
    from .ir import IRModule


KEY_FILE = "modelKey.bin"


@dataclass(frozen=True)
class CompileResult:
    """Where :func:`compile_model` put the artifact and what it wrote."""

    path: Path
    library: Path
    metadata: dict[str, Any]

    def __fspath__(self) -> str:
        return str(self.path)


def _check_output(path: Path, force: bool) -> None:
    if path.exists() and not path.is_dir():
        raise OutputExistsError(f"Output path '{path}' is a file: choose a directory path.")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise OutputExistsError(f"Output directory '{path}' already exists: pass --force (force_overwrite=True) "
                                "to replace it, or choose another path.")


@contextlib.contextmanager
def atomic_directory(path: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary directory next to ``path``; on success it replaces ``path``, else it is removed."""
    path = Path(path).absolute()
    _check_output(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the artifact should look like any mkdir
    try:
        yield tmp
        _check_output(path, force)  # someone may have created it meanwhile
        if path.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, trash / "old")
            os.replace(tmp, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def compile_model(
    ir: IRModule,
    target: Any = "llvm",
    host: Any = None,
    output_path: Any = "./compile_output",
    opt_level: int = 3,
    set_float16: bool = False,
    set_channel_layout: str | None = None,
    export_relay: bool = False,
    export_metadata: bool = False,
    force_overwrite: bool = False,
    uuid: str | None = None,
    encrypt_password: str | None = None,
    tuning_trials: int | None = None,
    records: str | os.PathLike[str] | bool | None = None,
    tuning_progress: Callable[[int, int, str], None] | None = None,
    tuning_rpc: Any = None,
) -> CompileResult:
    """Compile ``ir`` for ``target`` into ``output_path``.

    Parameters
    ----------
    ir:
        The model.
    target, host:
        Anything :func:`forgekit.targets.parse_target` accepts (tag, legacy string, JSON, dict).
    output_path:
        Artifact directory to create.  It must not exist (or be empty) unless ``force_overwrite``.
    opt_level:
        0-4, see :data:`forgekit.pipeline.OPT_LEVELS`.
    set_float16:
        Compute convolutions and matmuls in fp16 (fp32 accumulation).
    set_channel_layout:
        ``None``/``"first"`` keep NCHW; ``"last"`` converts convolutions and pools to NHWC.
    export_relay:
        Also write the optimized Relax IR as TVMScript (``model.relax.py``).
    export_metadata:
        Also write ``compile_report.json`` (operator histogram, passes, stage timings).
        ``metadata.json`` is always written: the runtime needs it.
    force_overwrite:
        Replace an existing ``output_path``.
    uuid:
        Identifier recorded in the metadata (a random UUID4 when None).
    encrypt_password:
        Encrypt the library with AES-256-GCM and write the password-wrapped data key to ``modelKey.bin``
        (format: ``docs/encryption-format.md``).  Loading then needs the key file and the password.

    tuning_trials:
        Measure the schedule knobs of the heavy kernels on this machine (CPU targets, opt_level >= 3;
        see :mod:`forgekit.tuning`).  ``N > 0`` measures up to N settings not measured before (so a
        second run resumes and adds N); ``0`` only reuses existing records; ``None`` (default) does
        not tune and uses no records.  The artifact keeps its records in
        ``output_path/optimization_artifacts/`` (resumed when the same output is recompiled with
        ``force_overwrite``).
    records:
        The records cache shared across models and runs: a folder, ``None`` for the default
        (``$FORGEKIT_RECORDS`` or ``~/.cache/forgekit/records``, a sub-folder per target) or ``False``
        to use only the artifact's own records.
    tuning_progress:
        Called as ``progress(done, total, note)`` after each measurement.
    tuning_rpc:
        Measure on a board over TVM RPC instead of this machine: a :class:`forgekit.rpc.RpcConfig`
        (tracker and key, or one server).  Needed to tune a cross target (e.g. ``raspberry-pi/5``);
        records are keyed by the target, as always.

    Returns
    -------
    CompileResult
        The artifact path, library path and the metadata written.
    """
    if encrypt_password is not None and not str(encrypt_password):
        from .crypto import EmptyPasswordError

        raise EmptyPasswordError("The encryption password is empty: choose a non-empty password.")
    if not isinstance(opt_level, int) or isinstance(opt_level, bool):
        raise UsageError(f"opt_level must be an integer 0-4, got {opt_level!r}.")
    layout = normalize_layout(set_channel_layout)
    if uuid is not None:
        try:
            uuid = str(_uuid.UUID(str(uuid)))
        except ValueError:
            raise UsageError(f"uuid '{uuid}' is not a valid UUID.") from None
    spec = parse_target(target, host)
    family = get_family(spec.family)
    output = Path(output_path)
    _check_output(output.absolute(), force_overwrite)
    fcompile = family.linker(spec)  # fails fast, before a long build, when the toolchain is missing

    start = time.perf_counter()
    report = BuildReport(opt_level)
    with contextlib.ExitStack() as stack:
        tuning = None
        staging = None
        if tuning_trials is not None:
            tuning, staging = _tuning_config(stack, spec, output, tuning_trials, records, tuning_progress)
            tuning.measure = _tuning_measure(stack, spec, fcompile, tuning_trials, tuning_rpc)
        elif tuning_rpc is not None:
            raise UsageError("An RPC device for tuning was given without tuning: add --tune-trials N.")
        executable = build_executable(ir, spec, opt_level=opt_level, float16=set_float16, layout=layout,
                                      report=report, tuning=tuning)
        if tuning is not None and tuning.measure is not None and report.tuning is not None:
            report.tuning["measured_on"] = tuning.measure.config.describe()  # records provenance: which board
        with atomic_directory(output, force_overwrite) as tmp:
            result = _write_artifact(tmp, output, ir, spec, family, fcompile, executable, report, start, uuid,
                                     encrypt_password, set_float16, layout, opt_level, export_relay,
                                     export_metadata, staging)
    return result


def _tuning_config(stack: contextlib.ExitStack, spec: Any, output: Path, trials: int, records: Any,
                   progress: Any) -> tuple[Any, Path]:
    """Record folders for a tuning build: a staging copy of the artifact's own records (resumed from an
    existing output) and the shared cache."""
    from . import tuning as tuner
    from .pipeline import TuningConfig

    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 0:
        raise UsageError(f"tuning_trials must be an integer >= 0, got {trials!r}.")
    staging = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="forgekit-records-"))) / tuner.ARTIFACT_RECORDS
    previous = output.absolute() / tuner.ARTIFACT_RECORDS
    if previous.is_dir():
        shutil.copytree(previous, staging)
    else:
        staging.mkdir()
    folders = [staging]
    if records is not False:
        base = Path(records) if records not in (None, True) else tuner.default_records_dir()
        folders.append(base / tuner.target_key(spec.tvm_target()))
    return TuningConfig(trials, folders, progress), staging


def _tuning_measure(stack: contextlib.ExitStack, spec: Any, fcompile: Any, trials: int, rpc: Any) -> Any:
    """How tuning times candidates: on this machine, or on an RPC device (required for a cross target,
    whose code cannot run here)."""
    if not trials:
        return None  # records only: nothing is measured
    if rpc is None:
        if spec.is_cross:
            raise UsageError(f"Tuning '{spec.name}' ({spec.arch}) measures kernels on such a CPU: give a board with "
                             "--rpc-tracker HOST:PORT --rpc-key KEY (or --rpc-host HOST:PORT), or --tune-trials 0.")
        return None
    from .remote_tuning import RemoteMeasure

    return stack.enter_context(RemoteMeasure(rpc, spec.arch, fcompile))


def _export_options(spec: Any, opt_level: int) -> dict[str, Any]:
    """Extra ``export_library`` arguments: CUDA targets pack their kernels compiled by nvcc."""
    if spec.kind != "cuda":
        return {}
    from . import devpack, nvcc
    from .targets.families.cuda import cuda_arch

    arch, fast_math = cuda_arch(spec), opt_level >= 4
    return {"fpack_imports": devpack.pack_imports(lambda source: nvcc.compile_fatbin(source, arch, fast_math))}


def _write_artifact(tmp: Path, output: Path, ir: Any, spec: Any, family: Any, fcompile: Any, executable: Any,
                    report: BuildReport, start: float, uuid: str | None, encrypt_password: str | None,
                    set_float16: bool, layout: str | None, opt_level: int, export_relay: bool,
                    export_metadata: bool, staging: Path | None) -> CompileResult:
    """Fill the temporary artifact directory ``tmp`` (renamed to ``output`` by the caller)."""
    library = tmp / md.LIBRARY_FILE
    t_export = time.perf_counter()
    try:
        options = _export_options(spec, opt_level)
        if fcompile is None:
            executable.export_library(str(library), **options)
        else:
            executable.export_library(str(library), fcompile=fcompile, **options)
    except ForgekitError:
        raise
    except Exception as exc:  # the linker's output is long; its last line says what broke
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        detail = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1] if lines else "")
        raise CompileError(f"Linking {md.LIBRARY_FILE} for {spec.name} failed: {detail.strip()}") from exc
    report.seconds["export"] = round(time.perf_counter() - t_export, 3)
    artifact_uuid = uuid or str(_uuid.uuid4())
    if encrypt_password is not None:
        from . import crypto

        t_encrypt = time.perf_counter()
        # The library is encrypted in place; the data key, wrapped by the password, goes to modelKey.bin.
        crypto.encrypt_library(library, library, tmp / KEY_FILE, encrypt_password, uuid=artifact_uuid,
                               fingerprint=ir.fingerprint, target=spec.name)
        report.seconds["encrypt"] = round(time.perf_counter() - t_encrypt, 3)
    compile_seconds = round(time.perf_counter() - start, 3)
    sha, size = md.file_digest(library)  # of the encrypted file when encrypted: what is shipped
    context = {
        "uuid": artifact_uuid,
        "created": md.created_timestamp(),
        "library": {"file": md.LIBRARY_FILE, "sha256": sha, "size": size,
                    "encrypted": encrypt_password is not None},
        "model": {
            "source": os.path.basename(ir._source.path) if ir._source and ir._source.path else None,
            "hash": f"{ir.structural_hash():016x}",
            "fingerprint": ir.fingerprint,
            "precision": "float16" if set_float16 else ir.precision,
            "quantization": ir.quantization,  # None unless ir.quantize() ran (forgekit.quantize)
            "layout": "NHWC" if layout == "last" else "NCHW",
            "inputs": [t.to_dict() for t in ir.input_nodes],
            "outputs": [t.to_dict() for t in ir.output_nodes],
        },
        "build": {
            "opt_level": opt_level,
            "float16": set_float16,
            "target": spec.target,
            "host": spec.host_dict,
            "target_name": spec.name,
            "family": spec.family,
            "triple": spec.to_dict()["triple"],
            "arch": spec.arch,
            # What the code was tuned for: LLVM CPU name and -mattr features of the CPU code, and the
            # GPU architecture of the device kernels (None for CPU targets).
            "cpu": spec.host_dict.get("mcpu"),
            "features": list(spec.host_dict.get("mattr", [])),
            "gpu_arch": spec.target.get("arch") if spec.kind == "cuda" else None,
            "toolchain": family.toolchain(spec),
            "compile_seconds": compile_seconds,
        },
        "versions": md.versions(),
    }
    (tmp / md.METADATA_FILE).write_text(md.render_metadata(**context))
    if export_relay:
        (tmp / "model.relax.py").write_text(ir.mod.script(show_meta=False))
    if staging is not None:
        shutil.copytree(staging, tmp / staging.name)
    if ir.quantization_report is not None:  # per-layer fp32-vs-int8 agreement (forgekit.quantize.report)
        (tmp / "quantization_report.json").write_text(json.dumps(ir.quantization_report, indent=2) + "\n")
    if export_metadata:
        report_data = {"operators": ir.operators, "passes": report.passes, "seconds": report.seconds,
                       "schedule_rules": report.schedule_rules, "tuning": report.tuning}
        (tmp / "compile_report.json").write_text(json.dumps(report_data, indent=2) + "\n")
    written = json.loads((tmp / md.METADATA_FILE).read_text())
    return CompileResult(output.absolute(), output.absolute() / md.LIBRARY_FILE, written)
