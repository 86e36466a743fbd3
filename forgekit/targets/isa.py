"""What a CPU target's instruction set offers the kernels: vector width, register budget, integer
dot-product instruction, and the features an artifact will require of the CPU that runs it.

One source of truth: LLVM's own feature list for the target's ``mcpu`` and ``mattr``
(``target.codegen.llvm_get_cpu_features``), never a table of CPU names of ours.  So ``-mcpu=cortex-a76``
has ``sdot`` because LLVM says Cortex-A76 has ``dotprod``; a tag only adds ``+dotprod`` where LLVM's CPU
model lacks it (NVIDIA Carmel).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..runtime.cpu import CODEGEN_FEATURES


#: the levels of a portable x86-64 artifact below v4 (:mod:`forgekit.targets.variants`): their kernels pack
#: weights in the layout v4's do (:func:`forgekit.backends.cpu.tiling.layout_tile`), so the levels' packed
#: weights are the same bytes, stored once (:mod:`forgekit.backends.cpu.shared_weights`)
SHARED_LAYOUT_CPUS = frozenset({"x86-64-v3", "x86-64-v2"})
#: the AVX-512 register file those levels take their weights' layout from
LAYOUT_LANES, LAYOUT_REGS = 16, 32


@dataclass(frozen=True)
class IsaInfo:
    """The facts a schedule rule needs about a CPU target."""

    vec_lanes: int  # fp32 lanes of one vector register
    num_regs: int  # architectural vector registers
    num_cores: int
    arch: str  # "x86" | "arm" | "other"
    #: integer dot-product instruction the int8 kernels use: "vnni" (x86 ``vpdpbusd``, u8 x s8),
    #: "sdot" (ARMv8.2 ``sdot``, s8 x s8), "avx2" (``vpmaddwd`` on int16-widened data, :data:`.int8.AVX2`)
    #: or "" (none: exact generic integer code)
    dot: str = ""
    features: frozenset[str] = frozenset()
    #: pack weights for AVX-512's tiles, whatever the vector width (see :data:`SHARED_LAYOUT_CPUS`)
    shared_layout: bool = False

    @property
    def acc_budget(self) -> int:
        """How many vector accumulators a micro-kernel may keep live."""
        return max(4, self.num_regs - 8)


def _key(target: Any) -> tuple[str, str, tuple[str, ...], int]:
    attrs = target.attrs
    mattr = tuple(str(x) for x in (attrs.get("mattr", None) or []))
    return str(attrs.get("mcpu", "") or ""), str(attrs.get("mtriple", "") or ""), mattr, \
        int(attrs.get("num-cores", 0) or 0)


@lru_cache(maxsize=64)
def _llvm_features(mcpu: str, mtriple: str, mattr: tuple[str, ...]) -> frozenset[str]:
    import tvm
    from tvm.target import codegen

    config: dict[str, Any] = {"kind": "llvm"}
    if mcpu:
        config["mcpu"] = mcpu
    if mtriple:
        config["mtriple"] = mtriple
    if mattr:
        config["mattr"] = list(mattr)
    return frozenset(str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target(config)))


def llvm_features(target: Any) -> frozenset[str]:
    """Every feature LLVM enables for a ``tvm.target.Target`` of kind llvm (its ``mcpu`` and ``mattr``)."""
    mcpu, mtriple, mattr, _ = _key(target)
    return _llvm_features(mcpu, mtriple, mattr)


def required_cpu_features(target: Any) -> list[str]:
    """The instruction-set extensions the code built for ``target`` may use, which the running CPU must have
    (what ``metadata.json`` records as ``build.cpu_features``)."""
    return sorted(llvm_features(target) & CODEGEN_FEATURES)


def isa_info(target: Any) -> IsaInfo:
    """:class:`IsaInfo` of a ``tvm.target.Target`` of kind llvm."""
    mcpu, mtriple, mattr, cores = _key(target)
    cores = cores or os.cpu_count() or 1
    features = _llvm_features(mcpu, mtriple, mattr)
    if mtriple.startswith(("aarch64", "arm")) or "neon" in features:
        # fixed-width NEON schedules (an SVE vector length is unknown at compile time)
        return IsaInfo(4, 32, cores, "arm", "sdot" if "dotprod" in features else "", features)
    if "avx512f" in features:
        return IsaInfo(16, 32, cores, "x86", "vnni" if "avx512vnni" in features else "avx2", features)
    shared = mcpu in SHARED_LAYOUT_CPUS
    if "avx2" in features:
        return IsaInfo(8, 16, cores, "x86", "avx2", features, shared)
    if mtriple.startswith("x86") or not mtriple:
        return IsaInfo(4, 16, cores, "x86", "", features, shared)
    return IsaInfo(4, 16, cores, "other", "", features)
