"""Writing an artifact around its linked libraries: encrypt them, render the metadata and the compile report.

Everything goes into the temporary directory the caller got from
:func:`~forgekit.artifact.outputs.atomic_directory`, where :func:`forgekit.backends.link.link_levels` linked the
libraries; nothing here knows about TVM, backends or the model façade: it takes the linked files, the target
spec, a :class:`~forgekit.description.ModelDescription` and the options.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid as _uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import metadata as md
from .layout import IR_FILE, KEY_FILE, LIBRARY_FILE, METADATA_FILE, QUANT_REPORT_FILE, REPORT_FILE, file_digest

if TYPE_CHECKING:
    from ..backends.link import Linked
    from ..build import BuildReport
    from ..description import ModelDescription
    from ..options import CompileOptions
    from ..targets import TargetSpec


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


def write_artifact(tmp: Path, final: Path, linked: Linked, spec: TargetSpec, model: ModelDescription,
                   options: CompileOptions, report: BuildReport, start: float, ir_text: str | None = None,
                   records: Path | None = None, io: dict[str, Any] | None = None) -> CompileResult:
    """Fill ``tmp`` (renamed to ``final`` by the caller), where ``linked`` (:func:`forgekit.backends.link.link_levels`)
    put the libraries, and return what the artifact will be."""
    library = tmp / LIBRARY_FILE
    files, shared = linked.files, linked.shared
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
    context = _metadata_context(spec, model, options, artifact_uuid, sha, size, compile_seconds, linked)
    context["build"]["levels"] = [v.name for v, _ in files if v.name]
    context["build"]["io"] = io  # what Engine may skip copying (forgekit.backends.cpu.io_buffers)
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
        from ..memory import peak_rss_mb

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
                      sha: str, size: int, compile_seconds: float, linked: Linked) -> dict[str, Any]:
    reduced = options.precision.value if options.precision != "float32" else None  # conv2d/matmul in fp16 or bf16
    return {
        "uuid": artifact_uuid,
        "created": md.created_timestamp(),
        "library": {"file": LIBRARY_FILE, "sha256": sha, "size": size,
                    "encrypted": options.encrypt_password is not None},
        "model": {
            "source": model.source,
            "hash": model.hash,
            "fingerprint": model.fingerprint,
            "precision": reduced or model.precision,
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
            "float16": reduced == "float16",
            "target": spec.target,
            "host": spec.host_dict,
            "target_name": spec.name,
            "family": spec.family,
            # a GPU adds what the device needs: gpu_arch, cuda release, min_driver (backends/cuda/export.py)
            "device": linked.device,
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
            "toolchain": linked.toolchain,
            "compile_seconds": compile_seconds,
        },
        "versions": md.versions(),
    }
