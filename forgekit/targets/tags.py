"""forgekit's own target tags.

TVM ships 287 tags, but they are named after boards of 2018 (``arm/rasp4b``), some carry wrong data
(``nvidia/jetson-orin-nano`` has a Xavier host CPU) and none covers Android or the x86 generations people
deploy to.  These tags are the names users type (``raspberry-pi/5``, ``android/cpu``, ``x86/znver4``);
each maps to a TVM target dict.  TVM's own tags remain valid targets too.

A tag is a plain dict entry: adding a board is one line.  ``family`` selects the module in
:mod:`forgekit.targets.families` that knows how to link and verify artifacts for it.
"""

from __future__ import annotations

from typing import Any

from .ti import BOARDS as _TI_BOARDS

_AARCH64 = "aarch64-linux-gnu"
_ARMHF = "armv7l-linux-gnueabihf"
_ANDROID64 = "aarch64-linux-android"
_ANDROID32 = "armv7a-linux-androideabi"


def _arm64(mcpu: str, cores: int, *extra: str, triple: str = _AARCH64) -> dict[str, Any]:
    return {"kind": "llvm", "mtriple": triple, "mcpu": mcpu, "mattr": ["+neon", *extra], "num-cores": cores}


def _armhf(mcpu: str) -> dict[str, Any]:
    return {"kind": "llvm", "mtriple": _ARMHF, "mcpu": mcpu, "mattr": ["+neon"], "mfloat-abi": "hard", "num-cores": 4}


def _x86(mcpu: str) -> dict[str, Any]:
    return {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu}


def _cuda(arch: str, host: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "cuda", "arch": arch, "host": host}


#: tag -> (family, description, TVM target dict)
TAGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # Raspberry Pi, 64-bit OS.  Cortex-A76 (Pi 5) is ARMv8.2: it has the dot-product instructions.
    "raspberry-pi/3": ("arm", "Raspberry Pi 3, 64-bit OS (Cortex-A53)", _arm64("cortex-a53", 4)),
    "raspberry-pi/4": ("arm", "Raspberry Pi 4/400/CM4, 64-bit OS (Cortex-A72)", _arm64("cortex-a72", 4)),
    "raspberry-pi/5": ("arm", "Raspberry Pi 5, 64-bit OS (Cortex-A76)", _arm64("cortex-a76", 4, "+dotprod")),
    # Raspberry Pi OS 32-bit (armhf): ARMv7 hard-float with NEON.
    "raspberry-pi/3-armhf": ("armhf", "Raspberry Pi 3, 32-bit OS (ARMv7 hard-float)", _armhf("cortex-a53")),
    "raspberry-pi/4-armhf": ("armhf", "Raspberry Pi 4, 32-bit OS (ARMv7 hard-float)", _armhf("cortex-a72")),
    # Generic aarch64 Linux boards.
    "arm/aarch64": ("arm", "Any ARMv8-A Linux (NEON; int8 also with dot-product kernels, chosen at load time)",
                    _arm64("generic", 4)),
    "arm/neoverse-n1": ("arm", "AWS Graviton2 / Ampere Altra (Neoverse-N1)", _arm64("neoverse-n1", 4, "+dotprod")),
    # Android.  armeabi-v7a is the softfp ABI (float arguments in core registers); LLVM spells that
    # "soft" while still using the VFP/NEON units through -mattr.  API level is a link-time concern (see the android family), not a codegen one.
    "android/cpu": ("android", "Android arm64-v8a", _arm64("cortex-a76", 8, "+dotprod", triple=_ANDROID64)),
    "android/arm64-v8a": ("android", "Android arm64-v8a (alias of android/cpu)",
                          _arm64("cortex-a76", 8, "+dotprod", triple=_ANDROID64)),
    "android/armeabi-v7a": (
        "android",
        "Android armeabi-v7a (32-bit)",
        {"kind": "llvm", "mtriple": _ANDROID32, "mcpu": "cortex-a53", "mattr": ["+neon"], "mfloat-abi": "soft",
         "num-cores": 8},
    ),
    # NVIDIA Jetson: CPU-only and GPU tags.  Host CPUs are the modules' real cores.
    "jetson/nano-cpu": ("arm", "Jetson Nano CPU (Cortex-A57)", _arm64("cortex-a57", 4)),
    "jetson/xavier-cpu": ("arm", "Jetson Xavier NX/AGX CPU (Carmel)", _arm64("carmel", 8, "+dotprod")),
    "jetson/orin-cpu": ("arm", "Jetson Orin NX/AGX CPU (Cortex-A78AE)", _arm64("cortex-a78", 12, "+dotprod")),
    "jetson/orin-nano-cpu": ("arm", "Jetson Orin Nano CPU (Cortex-A78AE)", _arm64("cortex-a78", 6, "+dotprod")),
    "jetson/nano": ("cuda", "Jetson Nano GPU (Maxwell sm_53)", _cuda("sm_53", _arm64("cortex-a57", 4))),
    "jetson/xavier": ("cuda", "Jetson Xavier GPU (Volta sm_72)", _cuda("sm_72", _arm64("carmel", 8, "+dotprod"))),
    "jetson/orin": ("cuda", "Jetson AGX Orin GPU (Ampere sm_87)",
                    _cuda("sm_87", _arm64("cortex-a78", 12, "+dotprod"))),
    "jetson/orin-nano": ("cuda", "Jetson Orin Nano GPU (Ampere sm_87)",
                         _cuda("sm_87", _arm64("cortex-a78", 6, "+dotprod"))),
    # x86-64 generations.  x86-64 (and bare "llvm") is portable: kernels for x86-64-v2/v3/v4 in one artifact,
    # chosen by CPUID at load time (forgekit.targets.variants); the dict here is its baseline level.
    "x86-64": ("x86", "Any x86-64: SSE4.2, AVX2 and AVX-512 kernels, the best chosen at load time",
               _x86("x86-64-v2")),
    "x86/avx2": ("x86", "Any x86-64 with AVX2+FMA (Haswell and later, Zen 1 and later)", _x86("haswell")),
    "x86/skylake-avx512": ("x86", "Intel Skylake-SP/X (AVX-512)", _x86("skylake-avx512")),
    "x86/cascadelake": ("x86", "Intel Cascade Lake (AVX-512 VNNI)", _x86("cascadelake")),
    "x86/icelake": ("x86", "Intel Ice Lake server (AVX-512 VNNI)", _x86("icelake-server")),
    "x86/sapphirerapids": ("x86", "Intel Sapphire Rapids (AVX-512, AMX)", _x86("sapphirerapids")),
    "x86/znver3": ("x86", "AMD Zen 3 (AVX2)", _x86("znver3")),
    "x86/znver4": ("x86", "AMD Zen 4 (AVX-512 VNNI)", _x86("znver4")),
    # Discrete NVIDIA GPUs with an x86 host.
    "cuda/sm_75": ("cuda", "NVIDIA Turing (T4, RTX 20xx)", _cuda("sm_75", {"kind": "llvm"})),
    "cuda/sm_80": ("cuda", "NVIDIA Ampere (A100)", _cuda("sm_80", {"kind": "llvm"})),
    "cuda/sm_86": ("cuda", "NVIDIA Ampere (RTX 30xx, A10, A40)", _cuda("sm_86", {"kind": "llvm"})),
    "cuda/sm_89": ("cuda", "NVIDIA Ada (L4, RTX 40xx)", _cuda("sm_89", {"kind": "llvm"})),
    "cuda/sm_90": ("cuda", "NVIDIA Hopper (H100, H200)", _cuda("sm_90", {"kind": "llvm"})),
    # TI Jacinto 7 / Sitara AM6x: their Arm cores (ARMv8.0, no dot product); the C7x/MMA accelerator is
    # reached with --offload tidl (forgekit.targets.ti has the boards, forgekit.offload.tidl the plan).
    **{b.tag: ("arm", b.description, _arm64(b.mcpu, b.cores)) for b in _TI_BOARDS},
}

#: Names that mean "the machine running forgekit"; resolved by detecting the CPU.
HOST_NAMES = ("host", "native")
