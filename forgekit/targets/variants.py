"""Portable targets: one artifact with its kernels built for several instruction-set levels, the best one
the running CPU has chosen when the artifact is loaded.

A ``host`` build is fast on this machine and dies with SIGILL on an older one; a plain SSE2 build runs
everywhere and is 2.6-5x slower (issue 20's table: ResNet-50 20.9 ms ``host`` vs 107 ms ``llvm``).
onnxruntime and OpenVINO dispatch by CPUID at run time; so do forgekit's portable targets, per library:
the x86-64 micro-architecture levels every distribution and compiler name (psABI x86-64-v2/v3/v4, LLVM
``-mcpu=x86-64-vN``), plus AVX-512 VNNI where the int8 kernels use it.

Why whole libraries, not per-kernel dispatch inside one: the schedules themselves depend on the vector
width (16 fp32 lanes on AVX-512, 8 on AVX2, 4 on SSE: tile sizes, packed weight layouts), so each level is
a different program, not the same program compiled with other flags.  Their weights are not: the levels
below v4 pack them in v4's layout (:func:`forgekit.backends.cpu.tiling.layout_tile`), and the arrays the
levels have in common are stored once, in a file each level maps (:mod:`forgekit.backends.cpu.shared_weights`;
ResNet-50: 142 MB for three levels instead of 399).  GCC/Clang ``target_clones`` would not help: TVM emits
LLVM IR per kernel, not C.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .parse import TargetSpec


@dataclass(frozen=True)
class Level:
    """One instruction-set level of a portable target."""

    name: str  # also the library's file-name suffix: model_library.<name>.so
    mcpu: str
    mattr: tuple[str, ...] = ()
    #: built only for quantized models (the feature helps the int8 kernels only: VNNI, sdot)
    quantized_only: bool = False


#: best first; the last is the baseline every CPU of the family must have (written as model_library.so)
X86_64_LEVELS = (
    Level("x86-64-v4-vnni", "x86-64-v4", ("+avx512vnni",), quantized_only=True),
    Level("x86-64-v4", "x86-64-v4"),  # AVX-512 F/BW/CD/DQ/VL: Skylake-SP, Ice Lake, Zen 4 and later
    Level("x86-64-v3", "x86-64-v3"),  # AVX2, FMA, BMI2: Haswell, Zen 1 and later
    Level("x86-64-v2", "x86-64-v2"),  # SSE4.2, POPCNT: Nehalem (2008) and later
)
AARCH64_LEVELS = (
    Level("armv8.2-dotprod", "generic", ("+neon", "+dotprod"), quantized_only=True),  # Cortex-A55/A76 and later
    Level("armv8-a", "generic", ("+neon",)),
)

#: names that mean "a portable artifact": the CLI and Action default, Forge's ``llvm``, and the generic tags
PORTABLE_NAMES = {"x86-64": "x86_64", "llvm": "x86_64", "arm/aarch64": "aarch64"}
LEVELS = {"x86_64": X86_64_LEVELS, "aarch64": AARCH64_LEVELS}


def portable_arch(name: str, tdict: dict[str, Any], host_arch: str) -> str | None:
    """The architecture whose levels ``name`` stands for, or None for a single-ISA target.

    Bare ``llvm`` is portable only where it would build for x86-64 (no ``-mtriple`` on an x86-64 machine):
    with any option (``llvm -mcpu=skylake``) it means exactly that CPU.
    """
    arch = PORTABLE_NAMES.get(name.strip())
    if arch is None:
        return None
    if name.strip() == "llvm" and (tdict.get("mtriple") or host_arch != "x86_64" or len(tdict) > 1):
        return None
    return arch


def baseline_target(arch: str, tdict: dict[str, Any]) -> dict[str, Any]:
    """The target dict of the baseline level (what ``build.target`` and ``build.cpu_features`` record)."""
    return _level_target(LEVELS[arch][-1], tdict, arch)


def _level_target(level: Level, tdict: dict[str, Any], arch: str) -> dict[str, Any]:
    triple = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}[arch]
    out = {k: v for k, v in tdict.items() if k not in ("mcpu", "mattr")}
    out.update({"kind": "llvm", "mtriple": tdict.get("mtriple") or triple, "mcpu": level.mcpu})
    if level.mattr:
        out["mattr"] = list(level.mattr)
    return out


@dataclass(frozen=True)
class Variant:
    """One library of an artifact: its level name (None for a single-ISA target) and the spec it is built for."""

    name: str | None
    spec: TargetSpec

    @property
    def cpu_features(self) -> list[str]:
        return self.spec.cpu_features()


def variants(spec: TargetSpec, quantized: bool) -> list[Variant]:
    """What to build for ``spec``, best level first and the baseline last; one unnamed variant for a
    single-ISA target."""
    if not spec.levels:
        return [Variant(None, spec)]
    arch = spec.arch
    chosen = [lv for lv in LEVELS[arch] if lv.name in spec.levels and (quantized or not lv.quantized_only)]
    return [Variant(lv.name, replace(spec, target=_level_target(lv, spec.target, arch), levels=()))
            for lv in chosen]


def model_variants(spec: TargetSpec, quantization: Any, operators: Any) -> list[Variant]:
    """:func:`variants` for one model: the int8 levels (VNNI, sdot) for models forgekit quantized
    (``quantization`` set) and for imported QDQ models (a ``quantize`` op) alike."""
    return variants(spec, quantized=quantization is not None or "quantize" in operators)


def best_here(levels: list[Variant]) -> int | None:
    """Index of the best level this machine's CPU runs (what an artifact loads here), None when none does."""
    from ..runtime.cpu import first_runnable, host_features

    return first_runnable([v.cpu_features for v in levels], host_features())


def level_names(arch: str) -> tuple[str, ...]:
    return tuple(lv.name for lv in LEVELS[arch])
