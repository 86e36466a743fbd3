"""Writing a compiled executable as an artifact: link the library, encrypt it, render the metadata.

Everything goes into the temporary directory the caller got from
:func:`~forgekit.artifact.outputs.atomic_directory`; nothing here knows about TVM passes or the model
façade: it takes the executable, the target spec, a :class:`~forgekit.description.ModelDescription`
and the options.
"""

from __future__ import annotations

import contextlib

import json
import re
import shutil
import time
import uuid as _uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import progress
from ..errors import CompileError, ForgekitError, OutputWriteError
from . import metadata as md
from .layout import (IR_FILE, KEY_FILE, LIBRARY_FILE, METADATA_FILE, QUANT_REPORT_FILE, REPORT_FILE, file_digest,
                     variant_file)

if TYPE_CHECKING:
    from ..build import BuildReport
    from ..description import ModelDescription
    from ..options import CompileOptions
    from ..targets import TargetSpec
    from ..targets.variants import Variant


@dataclass(frozen=True)
class CompileResult:
    """Where :func:`forgekit.compiler.compile_model` put the artifact and what it wrote."""

    path: Path
    library: Path
    metadata: dict[str, Any]
    #: fused kernel -> the schedule rule that scheduled it (CPU targets at opt level 3+; empty otherwise)
    schedule_rules: dict[str, str] = field(default_factory=dict)

    def __fspath__(self) -> str:
        return str(self.path)


def link_library(executable: Any, library: Path, spec: TargetSpec, fcompile: Callable[..., Any] | None,
                 opt_level: int, weights: Any = None, shared: Any = None) -> None:
    """``export_library`` with the family's linker and export options, embedding ``weights`` (a
    :class:`~forgekit.backends.cpu.weights.WeightStore`) when given, but for the arrays of ``shared`` (a
    :class:`~forgekit.backends.cpu.shared_weights.SharedWeights`); one line when linking fails."""
    try:
        progress.report(f"linking {library.name}")
        options = spec.family_impl.export_options(spec, opt_level)
        with contextlib.ExitStack() as stack:
            if weights is not None:
                from ..backends.cpu.weights import scratch_dir, with_sources

                scratch = Path(stack.enter_context(scratch_dir()))
                fcompile = with_sources(fcompile, weights.sources(scratch, spec.arch, shared))
            if fcompile is None:
                executable.export_library(str(library), **options)
            else:
                executable.export_library(str(library), fcompile=fcompile, **options)
    except ForgekitError:
        raise
    except Exception as exc:  # the linker's output is long; its last error line says what broke
        detail = link_error_line(str(exc))
        if "No space left on device" in str(exc):
            raise OutputWriteError(f"Linking {LIBRARY_FILE} failed: No space left on device. Nothing was written; "
                                   "free some space.") from exc
        raise CompileError(f"Linking {LIBRARY_FILE} for {spec.name} failed: {detail.strip()}") from exc


def link_error_line(output: str) -> str:
    """The line of a failed compile or link that says what broke: the last diagnostic (``error:``), not clang's
    closing count ("1 error generated.", which was all an Android link that missed a header said)."""
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() and not re.fullmatch(r"\s*\d+ errors? generated\.\s*", ln)]
    return (next((ln for ln in reversed(errors) if "error:" in ln), errors[-1] if errors else
                 lines[-1] if lines else "")).strip()


def write_artifact(tmp: Path, final: Path, executables: list[tuple[Variant, Any]], spec: TargetSpec,
                   fcompile: Callable[..., Any] | None, model: ModelDescription, options: CompileOptions,
                   report: BuildReport, start: float, ir_text: str | None = None,
                   records: Path | None = None) -> CompileResult:
    """Fill ``tmp`` (renamed to ``final`` by the caller) and return what the artifact will be.

    ``executables`` are the instruction-set levels, best first: the last (the baseline every CPU of the
    family runs) is ``model_library.so``, the others ``model_library.<level>.so``."""
    library = tmp / LIBRARY_FILE
    files = [(v, tmp / (LIBRARY_FILE if i == len(executables) - 1 else variant_file(v.name)))
             for i, (v, _) in enumerate(executables)]
    t_export = time.perf_counter()
    shared = None
    if len(executables) > 1 and options.encrypt_password is None:
        # the levels' common weights, once, in a file they map (an encrypted artifact's levels embed theirs:
        # loaded from memory, a library has no directory to find a file in)
        from ..backends.cpu import shared_weights

        shared = shared_weights.build([lowered.weights for _, lowered in executables])
        if shared is not None:
            shared.write(tmp)
    for (variant, path), (_, lowered) in zip(files, executables):
        link_library(lowered.executable, path, variant.spec, fcompile, options.opt_level, lowered.weights, shared)
    report.seconds["export"] = round(time.perf_counter() - t_export, 3)
    artifact_uuid = options.uuid or str(_uuid.uuid4())
    if options.encrypt_password is not None:
        from .. import crypto

        t_encrypt = time.perf_counter()
        # Encrypted in place; the data key, wrapped by the password, goes to modelKey.bin (one for all levels).
        crypto.encrypt_library(library, library, tmp / KEY_FILE, options.encrypt_password, uuid=artifact_uuid,
                               fingerprint=model.fingerprint, target=spec.name,
                               also=[(p, p) for _, p in files if p != library])
        report.seconds["encrypt"] = round(time.perf_counter() - t_encrypt, 3)
    compile_seconds = round(time.perf_counter() - start, 3)
    sha, size = file_digest(library)  # of the encrypted file when encrypted: what is shipped
    context = _metadata_context(spec, model, options, artifact_uuid, sha, size, compile_seconds)
    context["build"]["levels"] = [v.name for v, _ in files if v.name]
    if len(files) > 1:
        context["library"]["variants"] = [variant_entry(v.name, p, v.cpu_features) for v, p in files]
    if shared is not None:  # the levels' common weights (forgekit.backends.cpu.shared_weights)
        sha_w, size_w = file_digest(tmp / shared.name)
        context["library"]["weights"] = {"file": shared.name, "sha256": sha_w, "size": size_w}
    (tmp / METADATA_FILE).write_text(md.render_metadata(**context))
    if ir_text is not None:
        (tmp / IR_FILE).write_text(ir_text)
    if records is not None:
        shutil.copytree(records, tmp / records.name)
    if model.quantization_report is not None:  # per-layer fp32-vs-int8 agreement (forgekit.quantize.report)
        (tmp / QUANT_REPORT_FILE).write_text(json.dumps(model.quantization_report, indent=2) + "\n")
    if options.export_metadata:
        from ..runtime.stats import peak_rss_mb

        # the process's peak so far: for `forgekit compile` (one model per process) the compile's peak memory
        data = {"operators": model.operators, "passes": report.passes, "seconds": report.seconds,
                "peak_rss_mb": round(peak_rss_mb(), 1),
                "schedule_rules": report.schedule_rules, "kernel_flops": report.kernel_flops, "tuning": report.tuning}
        # a portable build's rules and FLOPs per level ({level: {"schedule_rules", "kernel_flops"}}): the profile
        # of a CPU that loads another level than the first finds its kernels there (BuildReport.levels, once
        # build.py records it: issue 38.11)
        if getattr(report, "levels", None):
            data["levels"] = report.levels
        (tmp / REPORT_FILE).write_text(json.dumps(data, indent=2) + "\n")
    written = json.loads((tmp / METADATA_FILE).read_text())
    return CompileResult(final, final / LIBRARY_FILE, written, dict(report.schedule_rules or {}))


def variant_entry(level: str | None, path: Path, cpu_features: list[str]) -> dict[str, Any]:
    """One level of a portable artifact as ``library.variants`` lists it."""
    sha, size = file_digest(path)
    return {"name": level, "file": path.name, "sha256": sha, "size": size, "cpu_features": cpu_features}


def _metadata_context(spec: TargetSpec, model: ModelDescription, options: CompileOptions, artifact_uuid: str,
                      sha: str, size: int, compile_seconds: float) -> dict[str, Any]:
    float16 = options.precision == "float16"
    bf16 = options.precision == "bfloat16"  # conv2d/matmul in bf16 (vdpbf16ps), the rest fp32
    return {
        "uuid": artifact_uuid,
        "created": md.created_timestamp(),
        "library": {"file": LIBRARY_FILE, "sha256": sha, "size": size,
                    "encrypted": options.encrypt_password is not None},
        "model": {
            "source": model.source,
            "hash": model.hash,
            "fingerprint": model.fingerprint,
            "precision": "float16" if float16 else "bfloat16" if bf16 else model.precision,
            "quantization": model.quantization,  # None unless the model was quantized (forgekit.quantize)
            "layout": "NHWC" if options.layout == "last" else "NCHW",
            # an input's "values" only when known (an index's table size, a quantized model's calibration)
            "inputs": [{**t.to_dict(), **({"values": model.input_values[t.name]} if t.name in model.input_values
                                          else {})} for t in model.inputs],
            "outputs": [t.to_dict() for t in model.outputs],
            "dynamic": model.dynamic,  # {} for a model of static shapes
            "frozen": model.frozen,  # inputs --freeze made constants: {} for most
        },
        "build": {
            "opt_level": options.opt_level,
            "float16": float16,
            "target": spec.target,
            "host": spec.host_dict,
            "target_name": spec.name,
            "family": spec.family,
            # a GPU family adds what the device needs: gpu_arch, cuda release, min_driver (families/cuda.py)
            "device": {"os": spec.family_impl.OS, "kind": spec.family_impl.DEVICE,
                       **(getattr(spec.family_impl, "device_requirements", lambda _spec: {})(spec))},
            "triple": spec.to_dict()["triple"],
            "arch": spec.arch,
            # What the code was tuned for: LLVM CPU name and -mattr features of the CPU code, and the GPU
            # architecture of the device kernels (None for CPU targets).
            "cpu": spec.host_dict.get("mcpu"),
            "features": list(spec.host_dict.get("mattr", [])),
            # What the running CPU must have (checked by forgekit.runtime before any code runs).
            "cpu_features": spec.cpu_features(),  # of the baseline level for a portable target
            "levels": [],  # the instruction-set levels built (portable targets; see write_artifact)
            "gpu_arch": spec.target.get("arch") if spec.is_cuda else None,
            "toolchain": spec.family_impl.toolchain(spec),
            "compile_seconds": compile_seconds,
        },
        "versions": md.versions(),
    }
