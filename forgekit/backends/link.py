"""Linking: the lowered executables of a build become the artifact's shared libraries.

The target's family gives the host side (its linker, its export options, its toolchain entries); the device
kind's backend adds its own (a CUDA target's nvcc check, fatbin and GPU requirements: :mod:`.cuda.export`; a
CPU build's lifted weights: :mod:`.cpu.weights`, :mod:`.cpu.shared_weights`).  What it returns is plain data
for :func:`forgekit.artifact.writer.write_artifact`, which knows files, not backends.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import progress
from ..artifact.layout import LIBRARY_FILE, variant_file
from ..errors import CompileError, ForgekitError, OutputWriteError

if TYPE_CHECKING:
    from ..targets import TargetSpec
    from ..targets.variants import Variant


@dataclass(frozen=True)
class Linked:
    """An artifact's libraries, linked into its temporary directory, and what its metadata says they need."""

    #: each instruction-set level and its library, best first (the last is ``model_library.so``)
    files: list[tuple[Variant, Path]]
    #: the levels' common weights, written once (:class:`.cpu.shared_weights.SharedWeights`), or None
    shared: Any
    #: metadata ``build.toolchain``: the host linker's entries, then the device kind's (nvcc)
    toolchain: dict[str, str]
    #: metadata ``build.device``: OS and device kind, then what the device needs (a GPU's arch, driver)
    device: dict[str, str] = field(default_factory=dict)


def _device_code(spec: TargetSpec) -> Any:
    """The device kind's part of linking (:mod:`.cuda.export`: ``check``, ``toolchain``, ``device_requirements``,
    ``export_options``); None for a CPU target, whose code is all the host's."""
    if spec.is_cuda:
        from .cuda import export

        return export
    return None


def linker(spec: TargetSpec) -> Callable[..., Any] | None:
    """The family's ``fcompile``, after the device kind's compiler is checked: fails fast, before a long build,
    when a toolchain is missing."""
    if (code := _device_code(spec)) is not None:
        code.check(spec)
    return spec.family_impl.linker(spec)


def toolchain(spec: TargetSpec) -> dict[str, str]:
    """Names and versions of the tools that build the target's libraries (metadata ``build.toolchain``)."""
    info = dict(spec.family_impl.toolchain(spec))
    if (code := _device_code(spec)) is not None:
        info.update(code.toolchain(spec))
    return info


def device(spec: TargetSpec) -> dict[str, str]:
    """Where the artifact runs (metadata ``build.device``): OS and device kind, and for a GPU what it needs."""
    out = {"os": spec.family_impl.OS, "kind": spec.family_impl.DEVICE}
    if (code := _device_code(spec)) is not None:
        out.update(code.device_requirements(spec))
    return out


#: linker flags of every artifact library.  TVM's LLVM codegen gives each kernel DWARF line and location
#: tables that no runtime reads (they map machine code to TIR, not to the model) and that grow with the code:
#: 30 of 120 KB on a 3-conv net, 2.6 MB of a 3.3 MB CRNN library, once per instruction-set level.  The
#: symbol table stays, so ``perf`` and ``gdb`` still name the kernels.
LINK_FLAGS = ("-Wl,--strip-debug",)


def export_options(spec: TargetSpec, opt_level: int) -> dict[str, Any]:
    """``Executable.export_library`` arguments: the family's, then the device kind's (a CUDA fatbin), and the
    linker flags of :data:`LINK_FLAGS` after the family's own."""
    options = dict(spec.family_impl.export_options(spec, opt_level))
    if (code := _device_code(spec)) is not None:
        options.update(code.export_options(spec, opt_level))
    options["options"] = [*options.get("options", ()), *LINK_FLAGS]
    return options


def link_levels(tmp: Path, executables: list[tuple[Variant, Any]], spec: TargetSpec,
                fcompile: Callable[..., Any] | None, opt_level: int, *, shared_weights: bool) -> Linked:
    """Link each level's executable (a :class:`forgekit.build.Lowered`) into ``tmp``: the last, the baseline every
    CPU of the family runs, is ``model_library.so``, the others ``model_library.<level>.so``.
    ``shared_weights``: the levels' common weights once, in a file they map (not for an encrypted artifact,
    whose levels embed theirs: loaded from memory, a library has no directory to find a file in)."""
    files = [(v, tmp / (LIBRARY_FILE if i == len(executables) - 1 else variant_file(v.name)))
             for i, (v, _) in enumerate(executables)]
    shared = None
    if len(executables) > 1 and shared_weights:
        from .cpu import shared_weights as common

        shared = common.build([lowered.weights for _, lowered in executables])
        if shared is not None:
            shared.write(tmp)
    libraries: list[str] = []
    for (variant, path), (_, lowered) in zip(files, executables):
        libraries += link_library(lowered.executable, path, variant.spec, fcompile, opt_level, lowered.weights, shared)
    needs = device(spec)
    if libraries:  # a GPU build's vendor libraries (cuDNN), which the runtime loads before the artifact
        needs["libraries"] = " ".join(sorted(set(libraries)))
    return Linked(files, shared, toolchain(spec), needs)


def link_library(executable: Any, library: Path, spec: TargetSpec, fcompile: Callable[..., Any] | None,
                 opt_level: int, weights: Any = None, shared: Any = None) -> list[str]:
    """``export_library`` with the family's linker and export options, embedding ``weights`` (a
    :class:`~forgekit.backends.cpu.weights.WeightStore`) when given, but for the arrays of ``shared`` (a
    :class:`~forgekit.backends.cpu.shared_weights.SharedWeights`); one line when linking fails.  Returns the
    shared libraries the device kind's extensions added (a CUDA build's ``libcudnn.so.9``)."""
    libraries: list[str] = []
    try:
        progress.report(f"linking {library.name}")
        options = export_options(spec, opt_level)
        with contextlib.ExitStack() as stack:
            if weights is not None:
                from .cpu.weights import scratch_dir, with_sources

                scratch = Path(stack.enter_context(scratch_dir()))
                fcompile = with_sources(fcompile, weights.sources(scratch, spec.arch, shared))
            if (code := _device_code(spec)) is not None:  # a CUDA build: the cuDNN extension when it calls it
                fcompile, libraries = code.with_extensions(executable, fcompile)
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
    return libraries


def link_error_line(output: str) -> str:
    """The line of a failed compile or link that says what broke: the last diagnostic (``error:``), not clang's
    closing count ("1 error generated.", which was all an Android link that missed a header said)."""
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() and not re.fullmatch(r"\s*\d+ errors? generated\.\s*", ln)]
    return (next((ln for ln in reversed(errors) if "error:" in ln), errors[-1] if errors else
                 lines[-1] if lines else "")).strip()
