"""Can this machine run an artifact?  Answered before any of its code executes.

A library built for AVX-512 loads fine on an AVX2 CPU and then dies with SIGILL on its first kernel, with
no message; an aarch64 library fails to load with "No such file".  The artifact's metadata says what it
needs (``build.arch``, ``build.family`` and ``build.cpu_features``: the instruction-set extensions its
code may use, in LLVM's names); :func:`check_runnable` compares that with what this CPU executes
(:mod:`forgekit.runtime.cpu`) and says what is missing and what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..artifact.layout import describe_device, device_of, shared_weights_file
from ..errors import ArtifactError, IncompatibleArtifactError, NotAvailableError
from .cpu import first_runnable, host_arch, host_features, normalize_arch
from .device import has_nvidia_gpu

#: ELF e_machine -> architecture, for a library given without metadata
_ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64", 0x28: "arm", 0x03: "x86", 0xF3: "riscv64"}


def elf_arch(library: Path) -> str | None:
    """The CPU architecture of an ELF file, None when it is not one (an encrypted library, say)."""
    try:
        with open(library, "rb") as handle:
            head = handle.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    order = "little" if head[5] == 1 else "big"
    return _ELF_MACHINES.get(int.from_bytes(head[18:20], order), f"ELF machine {int.from_bytes(head[18:20], order)}")


def suggest_target(features: frozenset[str] | set[str], arch: str) -> str:
    """A forgekit target tag this CPU runs (for the advice in messages)."""
    if arch == "x86_64":
        if {"avx512f", "avx512vnni"} <= features:
            return "x86/cascadelake"
        if "avx512f" in features:
            return "x86/skylake-avx512"
        if {"avx2", "fma"} <= features:
            return "x86/avx2"
        return "llvm"
    if arch == "aarch64":
        return "raspberry-pi/5" if "dotprod" in features else "arm/aarch64"
    return "host"


def check_runnable(meta: dict[str, Any], library: Path | None = None, name: str | None = None) -> None:
    """Raise :class:`IncompatibleArtifactError` (one line: what is missing, what to do) unless this machine
    can execute the artifact described by ``meta`` (and ``library``, whose ELF header is read when the
    metadata is missing)."""
    build = meta.get("build", {}) if meta else {}
    what = f"'{name}'" if name else "The artifact"
    device = device_of(meta)
    arch = normalize_arch(str(build.get("arch") or (elf_arch(library) if library else None) or host_arch()))
    here = host_arch()
    if device.get("os") != "linux":
        raise IncompatibleArtifactError(
            f"{what} is an {device.get('os')} library ({build.get('target_name') or arch}): it runs on the device, "
            "inside an app or with the forgekit-run program, not on this Linux machine.")
    if arch != here:
        raise IncompatibleArtifactError(
            f"{what} is an {arch} library and this machine is {here}: run it on the board, or check it here with "
            f"'forgekit verify ARTIFACT --onnx MODEL' (runs it under qemu).")
    if device.get("kind") == "cuda":  # the GPU itself and its libraries: forgekit.runtime.device, when loading
        if not has_nvidia_gpu():
            raise NotAvailableError(f"{what} is a CUDA artifact: it needs {describe_device(device)}; none found here: "
                                    "run it on a machine with one.")
        return
    if device.get("kind") != "cpu":
        raise NotAvailableError(f"{what} is a {device.get('kind')} artifact: forgekit.runtime runs CPU and CUDA "
                                "artifacts only.")
    required = [str(f) for f in build.get("cpu_features") or []]
    have = host_features()
    if not required or not have:  # an older artifact, or a CPU that cannot be asked: nothing to compare
        return
    missing = [f for f in required if f not in have]
    if missing:
        cpu = build.get("cpu") or "its CPU"
        portable = ", or -t llvm for any x86-64" if arch == "x86_64" else ""
        raise IncompatibleArtifactError(
            f"{what} was built for {arch} with {', '.join(missing)} ({cpu}); this CPU lacks {', '.join(missing)}: "
            f"recompile it for a target this CPU has (e.g. -t {suggest_target(have, here)}{portable}).")


#: force one instruction-set level of a portable artifact (benchmarks, tests); it must still run here
LEVEL_ENV = "FORGEKIT_LEVEL"


def check_size(meta: dict[str, Any], library: Path) -> None:
    """One line (ArtifactError) when ``library`` is not the size ``metadata.json`` records for it: a truncated
    library is a SIGBUS at its first weight (red-team: ``forgekit run`` died with exit 135 and no message),
    a partly copied one worse.  One ``stat``; the sha256 is for ``publish`` and ``verify``, which read it all."""
    section = (meta or {}).get("library") or {}
    sizes = {str(v.get("file")): v.get("size") for v in section.get("variants") or []}
    sizes[str(section.get("file", library.name))] = section.get("size")
    expected = sizes.get(library.name)
    if not isinstance(expected, int) or not library.is_file():
        return
    actual = library.stat().st_size
    if actual != expected:
        raise ArtifactError(f"'{library}' is {actual} bytes but its metadata.json records {expected}: the file is "
                            "damaged or was partly copied; copy the artifact again.")


def choose_library(meta: dict[str, Any], library: Path, name: str | None = None) -> tuple[Path, str | None]:
    """The library of a portable artifact that this CPU runs best, and its level name.

    ``library.variants`` lists the levels best first, each with the CPU features it needs; the first this
    CPU has all of wins (the baseline, ``model_library.so``, is last and :func:`check_runnable` has already
    checked it).  A CPU that cannot be asked gets the baseline.  A single-ISA artifact: ``(library, None)``.
    """
    import os

    levels = ((meta or {}).get("library") or {}).get("variants") or []
    if not levels or library.name != (meta.get("library") or {}).get("file", library.name):
        return library, None
    have = host_features()
    best = first_runnable([v.get("cpu_features") or [] for v in levels], have)
    forced = os.environ.get(LEVEL_ENV, "").strip()
    if forced:
        names = [str(v.get("name")) for v in levels]
        if forced not in names:
            raise IncompatibleArtifactError(f"{LEVEL_ENV}={forced} is not a level of {name or library}: it has "
                                            f"{', '.join(names)}.")
        chosen = levels[names.index(forced)]
        if have and not set(chosen.get("cpu_features") or []) <= have:
            raise IncompatibleArtifactError(f"{LEVEL_ENV}={forced}: this CPU cannot run that level of "
                                            f"{name or library}; unset it to let forgekit choose.")
    else:
        chosen = levels[best] if best is not None else levels[-1]
    shared = shared_weights_file(meta)
    if shared and not (library.parent / shared).is_file():  # the levels' common weights, mapped on first use
        raise ArtifactError(f"{name or library} has no {shared}: the instruction-set levels of this portable "
                            "artifact share their weights in it; copy the whole artifact directory.")
    return library.parent / str(chosen["file"]), str(chosen["name"])
