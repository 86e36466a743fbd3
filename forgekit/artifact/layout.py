"""The files of an artifact directory, named once, and how to find them.

Only the standard library and :mod:`forgekit.errors`: the deployed runtime imports this module.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..errors import ArtifactError

LIBRARY_FILE = "model_library.so"
METADATA_FILE = "metadata.json"
KEY_FILE = "modelKey.bin"
REPORT_FILE = "compile_report.json"
QUANT_REPORT_FILE = "quantization_report.json"
IR_FILE = "model.relax.py"
RECORDS_DIR = "optimization_artifacts"
BENCH_FILE = "bench.json"
#: what a level's library of a portable artifact exports to map and check the weights file the levels share
#: (forgekit/backends/cpu/shared_weights.py); the runtimes call it right after loading the library
SHARED_WEIGHTS_CHECK = "forgekit_shared_weights"


def variant_file(level: str) -> str:
    """File name of the library of one instruction-set level above a portable artifact's baseline."""
    return f"model_library.{level}.so"


def library_digests(meta: dict[str, Any] | None) -> dict[str, str | None]:
    """Every library file of an artifact -> the sha256 its metadata records: the baseline ``model_library.so``
    first, then the other levels of a portable artifact (``library.variants``) and the weights file they share
    (``library.weights``)."""
    library = (meta or {}).get("library") or {}
    digests: dict[str, str | None] = {LIBRARY_FILE: library.get("sha256")}
    for entry in [*(library.get("variants") or []), library.get("weights") or {}]:
        if entry.get("file"):
            digests.setdefault(str(entry["file"]), entry.get("sha256"))
    return digests


def shared_weights_file(meta: dict[str, Any] | None) -> str | None:
    """The file the levels of a portable artifact share their weights in, if it has one."""
    return (((meta or {}).get("library") or {}).get("weights") or {}).get("file")


def library_files(meta: dict[str, Any] | None) -> list[str]:
    """Every library file of an artifact, the baseline ``model_library.so`` first."""
    return list(library_digests(meta))


def resolve(path: str | Path) -> tuple[Path, Path | None]:
    """(library, metadata or None) of an artifact directory or of a library file given directly."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"Artifact '{path}' does not exist: compile one with 'forgekit compile'.")
    if path.is_dir():
        library = path / LIBRARY_FILE
        if not library.exists():
            raise ArtifactError(f"'{path}' has no {LIBRARY_FILE}: is it a forgekit artifact directory?")
        meta = path / METADATA_FILE
        return library, meta if meta.exists() else None
    meta = path.parent / METADATA_FILE
    return path, meta if meta.exists() else None


def artifact_dir(path: str | Path) -> Path:
    """``path`` when it is an artifact directory (library and metadata), else a one-line ArtifactError."""
    directory = Path(path)
    if not (directory / LIBRARY_FILE).is_file() or not (directory / METADATA_FILE).is_file():
        raise ArtifactError(f"'{path}' is not a forgekit artifact directory ({LIBRARY_FILE} + {METADATA_FILE}).")
    return directory


def read_metadata(path: str | Path) -> dict[str, Any]:
    """``metadata.json`` of an artifact directory (or the file itself), parsed."""
    path = Path(path)
    meta = path / METADATA_FILE if path.is_dir() else path
    try:
        return json.loads(meta.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"'{path}' has no {METADATA_FILE}: is it a forgekit artifact directory?") from None
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"'{meta}' is not readable JSON ({exc}): recompile the artifact.") from None


def file_digest(path: Path) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest(), Path(path).stat().st_size


def device_of(meta: dict[str, Any]) -> dict[str, str]:
    """Where an artifact runs, as its metadata says: ``{"os": "linux"|"android", "kind": "cpu"|"cuda"}``
    (written by the target family; derived from the family name for artifacts older than that field)."""
    build = meta.get("build", {}) if meta else {}
    if build.get("device"):
        return dict(build["device"])
    family = build.get("family")
    return {"os": "android" if family == "android" else "linux", "kind": "cuda" if family == "cuda" else "cpu"}


def describe_device(device: dict[str, Any]) -> str:
    """The GPU a CUDA artifact needs, as its ``build.device`` records it: ``an NVIDIA GPU sm_90 (Hopper) with a
    CUDA 13.0 driver (R580 or newer)`` (older artifacts record only the kind: ``an NVIDIA GPU``)."""
    generation = f" ({device['gpu_generation']})" if device.get("gpu_generation") else ""
    driver = f" (R{device['min_driver']} or newer)" if device.get("min_driver") else ""
    cuda = f" with a CUDA {device['cuda']} driver{driver}" if device.get("cuda") else ""
    arch = f" {device['gpu_arch']}" if device.get("gpu_arch") else ""
    libraries = {"libcudnn.so.9": "cuDNN 9"}
    extra = ", ".join(libraries.get(name, name) for name in str(device.get("libraries") or "").split())
    return f"an NVIDIA GPU{arch}{generation}{cuda}" + (f" and {extra}" if extra else "")
