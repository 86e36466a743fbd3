"""Derive vector width / register budget / integer dot-product instruction from an llvm Target."""
from dataclasses import dataclass

_AVX512 = ("skylake-avx512", "cascadelake", "cooperlake", "icelake", "icelake-server",
           "icelake-client", "tigerlake", "sapphirerapids", "emeraldrapids", "graniterapids",
           "znver4", "znver5", "rocketlake", "cannonlake", "knl", "knm", "x86-64-v4")
#: CPUs with AVX512-VNNI (``vpdpbusd``; LLVM -mcpu names); ``+avx512vnni`` in ``mattr`` also counts
_VNNI = ("cascadelake", "cooperlake", "icelake", "icelake-server", "icelake-client", "tigerlake",
         "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5", "rocketlake")
#: ARMv8.2+ cores with the dot-product extension (``sdot``/``udot``); ``+dotprod`` in ``mattr`` also counts.
#: Cortex-A53/A57/A72 (Raspberry Pi 3/4, Jetson Nano) have none.
_DOTPROD = ("cortex-a55", "cortex-a65", "cortex-a75", "cortex-a76", "cortex-a77", "cortex-a78", "cortex-a78c",
            "cortex-a510", "cortex-a710", "cortex-a715", "cortex-a720", "cortex-x1", "cortex-x2", "cortex-x3",
            "cortex-x4", "neoverse-n1", "neoverse-n2", "neoverse-v1", "neoverse-v2", "carmel", "apple-m1",
            "apple-m2", "apple-m3", "ampere1", "ampere1a")
_AVX2 = ("haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake", "znver1",
         "znver2", "znver3", "x86-64-v3", "core-avx2")


@dataclass
class TargetInfo:
    vec_lanes: int      # fp32 lanes of one vector register
    num_regs: int       # architectural vector registers
    num_cores: int
    arch: str           # "x86" | "arm" | "other"
    #: integer dot-product instruction the int8 kernels use: "vnni" (x86 ``vpdpbusd``, u8 x s8),
    #: "sdot" (ARMv8.2 ``sdot``, s8 x s8) or "" (none: exact generic integer code)
    dot: str = ""

    @property
    def acc_budget(self):
        """How many vector accumulators a micro-kernel may keep live."""
        return max(4, self.num_regs - 8)


def target_info(target) -> TargetInfo:
    attrs = target.attrs
    mcpu = str(attrs.get("mcpu", "") or "")
    mtriple = str(attrs.get("mtriple", "") or "")
    mattr = [str(x) for x in (attrs.get("mattr", None) or [])]
    cores = int(attrs.get("num-cores", 0) or 0)
    if not cores:
        import os
        cores = os.cpu_count() or 1
    if "aarch64" in mtriple or "arm" in mtriple or any("neon" in a for a in mattr):
        lanes = 4
        if any(a.startswith("+sve") for a in mattr):
            lanes = 4  # fixed-width NEON schedules; SVE length unknown at compile time
        return TargetInfo(lanes, 32, cores, "arm", "sdot" if mcpu in _DOTPROD or "+dotprod" in mattr else "")
    if mcpu in _AVX512 or "+avx512f" in mattr:
        return TargetInfo(16, 32, cores, "x86", "vnni" if mcpu in _VNNI or "+avx512vnni" in mattr else "")
    if mcpu in _AVX2 or "+avx2" in mattr:
        return TargetInfo(8, 16, cores, "x86")
    if mtriple.startswith("x86") or not mtriple:
        return TargetInfo(4, 16, cores, "x86")
    return TargetInfo(4, 16, cores, "other")
