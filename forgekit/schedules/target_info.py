"""Derive vector width / register budget from an llvm Target."""
from dataclasses import dataclass

_AVX512 = ("skylake-avx512", "cascadelake", "cooperlake", "icelake", "icelake-server",
           "icelake-client", "tigerlake", "sapphirerapids", "emeraldrapids", "graniterapids",
           "znver4", "znver5", "rocketlake", "cannonlake", "knl", "knm", "x86-64-v4")
_AVX2 = ("haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake", "znver1",
         "znver2", "znver3", "x86-64-v3", "core-avx2")


@dataclass
class TargetInfo:
    vec_lanes: int      # fp32 lanes of one vector register
    num_regs: int       # architectural vector registers
    num_cores: int
    arch: str           # "x86" | "arm" | "other"

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
        return TargetInfo(lanes, 32, cores, "arm")
    if mcpu in _AVX512 or "+avx512f" in mattr:
        return TargetInfo(16, 32, cores, "x86")
    if mcpu in _AVX2 or "+avx2" in mattr:
        return TargetInfo(8, 16, cores, "x86")
    if mtriple.startswith("x86") or not mtriple:
        return TargetInfo(4, 16, cores, "x86")
    return TargetInfo(4, 16, cores, "other")
