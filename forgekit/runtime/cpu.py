"""What the running CPU can execute, asked of the CPU itself (CPUID / the kernel's HWCAP), never of
``/proc/cpuinfo``.

Why not ``/proc/cpuinfo``: under user-mode emulation (``qemu-x86_64 -cpu Haswell``) and in some
containers it describes the *host* CPU, so an AVX-512 artifact would pass the check and then die with
SIGILL.  CPUID executed by the process is what the emulator (and the hardware) actually implement.

Why not a package (py-cpuinfo, archspec): py-cpuinfo runs CPUID in a subprocess (about a second) and
reads /proc/cpuinfo first; archspec reads /proc/cpuinfo.  A CPUID call is 40 bytes of machine code.

Feature names are LLVM's (``avx512f``, ``sse4.1``, ``dotprod``), the vocabulary the compiler uses,
so an artifact's requirement list and this machine's feature set compare directly.
"""

from __future__ import annotations

import ctypes
import mmap
import platform
from functools import lru_cache

#: x86 CPUID bits: (leaf, subleaf, register index 0..3 = eax, ebx, ecx, edx, bit) -> LLVM feature name
_X86_BITS: dict[tuple[int, int, int, int], str] = {
    (1, 0, 2, 0): "sse3", (1, 0, 2, 1): "pclmul", (1, 0, 2, 9): "ssse3", (1, 0, 2, 12): "fma",
    (1, 0, 2, 13): "cx16", (1, 0, 2, 19): "sse4.1", (1, 0, 2, 20): "sse4.2", (1, 0, 2, 22): "movbe",
    (1, 0, 2, 23): "popcnt", (1, 0, 2, 25): "aes", (1, 0, 2, 26): "xsave", (1, 0, 2, 28): "avx",
    (1, 0, 2, 29): "f16c", (1, 0, 2, 30): "rdrnd", (1, 0, 3, 25): "sse", (1, 0, 3, 26): "sse2",
    (7, 0, 1, 3): "bmi", (7, 0, 1, 5): "avx2", (7, 0, 1, 8): "bmi2", (7, 0, 1, 16): "avx512f",
    (7, 0, 1, 17): "avx512dq", (7, 0, 1, 18): "rdseed", (7, 0, 1, 19): "adx", (7, 0, 1, 21): "avx512ifma",
    (7, 0, 1, 28): "avx512cd", (7, 0, 1, 29): "sha", (7, 0, 1, 30): "avx512bw", (7, 0, 1, 31): "avx512vl",
    (7, 0, 2, 1): "avx512vbmi", (7, 0, 2, 6): "avx512vbmi2", (7, 0, 2, 8): "gfni", (7, 0, 2, 9): "vaes",
    (7, 0, 2, 10): "vpclmulqdq", (7, 0, 2, 11): "avx512vnni", (7, 0, 2, 12): "avx512bitalg",
    (7, 0, 2, 14): "avx512vpopcntdq", (7, 0, 3, 22): "amx-bf16", (7, 0, 3, 23): "avx512fp16",
    (7, 0, 3, 24): "amx-tile", (7, 0, 3, 25): "amx-int8", (7, 1, 0, 4): "avxvnni", (7, 1, 0, 5): "avx512bf16",
    (0x80000001, 0, 2, 5): "lzcnt", (0x80000001, 0, 2, 6): "sse4a", (0x80000001, 0, 2, 8): "prfchw",
    (0x80000001, 0, 2, 11): "xop", (0x80000001, 0, 2, 16): "fma4",
}
#: features whose registers the OS must save (XCR0 bits): AVX needs YMM state, AVX-512 the opmask and
#: ZMM state, AMX the tile state.  Without them the instructions fault even though CPUID lists them.
_AVX_FAMILY = {"avx", "avx2", "fma", "f16c", "vaes", "vpclmulqdq", "avxvnni", "fma4", "xop"}
_XCR0_AVX = 0b110
_XCR0_AVX512 = 0b1110_0110
_XCR0_AMX = (1 << 17) | (1 << 18)

#: aarch64 HWCAP / HWCAP2 bits (linux/arch/arm64/include/uapi/asm/hwcap.h) -> LLVM feature name
_ARM64_HWCAP = {1: "neon", 3: "aes", 6: "sha2", 7: "crc", 8: "lse", 9: "fullfp16", 12: "rdm", 15: "rcpc",
                17: "sha3", 20: "dotprod", 22: "sve", 23: "fp16fml"}
_ARM64_HWCAP2 = {1: "sve2", 13: "i8mm", 14: "bf16"}
#: 32-bit ARM HWCAP bits (linux/arch/arm/include/uapi/asm/hwcap.h)
_ARM32_HWCAP = {12: "neon", 16: "vfp4", 19: "d32"}
_AT_HWCAP, _AT_HWCAP2 = 16, 26

# push rbx; mov eax, edi; mov ecx, esi; mov r8, rdx; cpuid; mov [r8], eax; mov [r8+4], ebx;
# mov [r8+8], ecx; mov [r8+12], edx; pop rbx; ret   (System V: leaf, subleaf, uint32_t out[4])
_CPUID_CODE = bytes.fromhex("53 89f8 89f1 4989d0 0fa2 418900 41895804 41894808 4189500c 5b c3")
# mov ecx, edi; xgetbv; shl rdx, 32; or rax, rdx; ret   (returns XCR[index])
_XGETBV_CODE = bytes.fromhex("89f9 0f01d0 48c1e220 4809d0 c3")


def _machine_code(code: bytes, restype, *argtypes):
    """A callable for ``code`` in its own page: written read-write, then made read+execute (never both
    writable and executable, which hardened kernels refuse)."""
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    page.write(code)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.mprotect(ctypes.c_void_p(address), mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")
    function = ctypes.CFUNCTYPE(restype, *argtypes)(address)
    function._page = page  # the page lives as long as the function
    return function


def _x86_features() -> set[str]:
    out = (ctypes.c_uint32 * 4)()
    cpuid = _machine_code(_CPUID_CODE, None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32 * 4))

    def query(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
        cpuid(leaf, subleaf, ctypes.byref(out))
        return tuple(out)  # type: ignore[return-value]

    max_leaf, max_ext = query(0)[0], query(0x80000000)[0]
    regs: dict[tuple[int, int], tuple[int, ...]] = {}
    for leaf, subleaf in {(k[0], k[1]) for k in _X86_BITS}:
        available = max_ext if leaf >= 0x80000000 else max_leaf
        if leaf <= available and (leaf != 7 or subleaf <= query(7, 0)[0]):
            regs[(leaf, subleaf)] = query(leaf, subleaf)
    found = {name for (leaf, sub, reg, bit), name in _X86_BITS.items()
             if (leaf, sub) in regs and regs[(leaf, sub)][reg] >> bit & 1}
    osxsave = bool(regs.get((1, 0), (0, 0, 0, 0))[2] >> 27 & 1)
    xcr0 = _machine_code(_XGETBV_CODE, ctypes.c_uint64, ctypes.c_uint32)(0) if osxsave else 0
    if xcr0 & _XCR0_AVX != _XCR0_AVX:
        found -= _AVX_FAMILY | {f for f in found if f.startswith(("avx512", "amx"))}
    elif xcr0 & _XCR0_AVX512 != _XCR0_AVX512:
        found -= {f for f in found if f.startswith("avx512")}
    if xcr0 & _XCR0_AMX != _XCR0_AMX:
        found -= {f for f in found if f.startswith("amx")}
    return found


def _hwcap_features(table: dict[int, str], table2: dict[int, str]) -> set[str]:
    libc = ctypes.CDLL(None)
    libc.getauxval.restype = ctypes.c_ulong
    libc.getauxval.argtypes = [ctypes.c_ulong]
    caps, caps2 = libc.getauxval(_AT_HWCAP), libc.getauxval(_AT_HWCAP2)
    return {n for b, n in table.items() if caps >> b & 1} | {n for b, n in table2.items() if caps2 >> b & 1}


def normalize_arch(machine: str) -> str:
    """``x86_64``, ``aarch64`` or ``arm`` for the spellings uname, LLVM triples and Python use."""
    machine = machine.lower()
    if machine in ("amd64", "x86_64", "x64"):
        return "x86_64"
    if machine in ("arm64", "aarch64"):
        return "aarch64"
    if machine.startswith("arm"):
        return "arm"
    return machine


@lru_cache(maxsize=None)
def host_arch() -> str:
    """This machine's CPU architecture (``x86_64``, ``aarch64``, ``arm``...)."""
    return normalize_arch(platform.machine())


@lru_cache(maxsize=None)
def host_features() -> frozenset[str]:
    """LLVM names of the instruction-set features this CPU (and OS) can execute; empty when unknown."""
    try:
        arch = host_arch()
        if arch == "x86_64":
            return frozenset(_x86_features())
        if arch == "aarch64":
            return frozenset(_hwcap_features(_ARM64_HWCAP, _ARM64_HWCAP2) | {"neon"})
        if arch == "arm":
            return frozenset(_hwcap_features(_ARM32_HWCAP, {}))
    except (OSError, AttributeError, ValueError):  # a locked-down process: no check rather than no run
        pass
    return frozenset()


def first_runnable(requirements: list[list[str]] | list[set[str]], have: frozenset[str]) -> int | None:
    """Index of the first feature list (levels are listed best first) that ``have`` covers; None when none
    does or the CPU could not be asked (``have`` empty)."""
    if not have:
        return None
    return next((i for i, needs in enumerate(requirements) if set(needs) <= have), None)


#: the features an artifact may require: the instruction-set extensions LLVM emits for numeric code
#: (vector units, FMA, bit manipulation, dot products).  Left out: what only intrinsics use (aes, sha,
#: pclmul, rdrnd...) and AMD's sse4a, so a znver4 artifact is not refused on an Intel AVX-512 CPU for them.
CODEGEN_FEATURES = frozenset({
    "sse", "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi", "bmi2",
    "lzcnt", "movbe", "fma4", "xop", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512vnni",
    "avx512bf16", "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512bitalg", "avx512vpopcntdq", "avx512fp16",
    "avxvnni", "amx-tile", "amx-int8", "amx-bf16",
    "neon", "dotprod", "fullfp16", "fp16fml", "rdm", "lse", "i8mm", "bf16", "sve", "sve2", "vfp4", "d32",
})


def describe_features(arch: str, features: list[str] | frozenset[str] | set[str]) -> str:
    """A short human form of an artifact's CPU requirement, e.g. ``x86-64 with AVX-512 (VNNI, BF16)``."""
    have = set(features)
    if arch == "x86_64":
        if "avx512f" in have:
            extras = [name for flag, name in (("avx512vnni", "VNNI"), ("avx512bf16", "BF16"), ("amx-tile", "AMX"))
                      if flag in have]
            return "x86-64 with AVX-512" + (f" ({', '.join(extras)})" if extras else "")
        if "avx2" in have:
            return "x86-64 with AVX2" + (" and FMA" if "fma" in have else "")
        if "sse4.2" in have:
            return "x86-64 with SSE4.2"
        return "any x86-64"
    if arch == "aarch64":
        extras = [name for flag, name in (("dotprod", "dot product"), ("i8mm", "int8 matmul"), ("bf16", "BF16"),
                                          ("sve", "SVE")) if flag in have]
        return "ARMv8 with NEON" + (f" and {', '.join(extras)}" if extras else "")
    if arch == "arm":
        return "ARMv7 with NEON" if "neon" in have else "ARMv7"
    return arch


def physical_cores() -> int:
    """The cores this process may run on, SMT siblings counted once (Linux sysfs topology; the CPU count
    where that is unreadable)."""
    import os
    from pathlib import Path

    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topology.joinpath("physical_package_id").read_text().strip(),
                       topology.joinpath("core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))
