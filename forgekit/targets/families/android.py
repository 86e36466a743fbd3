"""Android (arm64-v8a, armeabi-v7a).

With ``ANDROID_NDK_HOME`` set, the NDK's clang links against Bionic.  Without it, Debian's ``clang`` and
``lld`` link a self-contained library with ``-nostdlib`` (TVM's generated code needs no libc symbols of
its own), with 16 KB page alignment as Android 15 requires.
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING, Any, Callable

from .base import require, tool_version

if TYPE_CHECKING:
    from ..parse import TargetSpec

DESCRIPTION = "Android"
API_LEVEL = 21


def _clang_target(spec: TargetSpec) -> str:
    triple = spec.triple or "aarch64-linux-android"
    if triple.startswith("armv7"):
        triple = "armv7a-linux-androideabi"
    return f"{triple}{API_LEVEL}"


def _ndk_clang() -> str | None:
    ndk = os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")
    if not ndk:
        return None
    found = glob.glob(os.path.join(ndk, "toolchains", "llvm", "prebuilt", "*", "bin", "clang++"))
    return found[0] if found else None


def linker(spec: TargetSpec) -> Callable[..., Any] | None:
    from tvm.support import cc

    flags = [f"--target={_clang_target(spec)}", "-Wl,-z,max-page-size=16384", "-Wl,--build-id",
             "-Wl,--hash-style=both"]
    ndk = _ndk_clang()
    if ndk:
        return cc.cross_compiler(ndk, options=flags)
    clang = require("clang", "clang", image="android")
    require("ld.lld", "lld", image="android")
    return cc.cross_compiler(clang, options=[*flags, "-fuse-ld=lld", "-nostdlib"])


def toolchain(spec: TargetSpec) -> dict[str, str]:
    tool = _ndk_clang() or "clang"
    return {"linker": tool, "linker_version": tool_version(tool), "android_api": str(API_LEVEL)}
