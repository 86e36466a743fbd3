"""Android (arm64-v8a, armeabi-v7a).

With ``ANDROID_NDK_HOME`` set, the NDK's clang links against Bionic.  Without it, Debian's ``clang`` and
``lld`` link with ``-nostdlib``, and stub libraries stand in for Bionic's ``libc.so``/``libm.so`` when the
code needs them.  Either way the library names ``libtvm_ffi.so`` (and ``libtvm_runtime.so`` if used) in
``DT_NEEDED``, has 16 KB page alignment as Android 15 requires, is linked ``-z now`` and ``-z text`` (no
TEXTREL: Android 6+ refuses them) and carries ``DT_SONAME``.
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING, Any, Callable

from ...toolchain import require, tool_version

if TYPE_CHECKING:
    from ..parse import TargetSpec

DESCRIPTION = "Android"
OS = "android"
DEVICE = "cpu"
API_LEVEL = 21
#: DT_SONAME of the artifact: its file name, so the loader identifies it the same way however it is opened.
SONAME = "model_library.so"


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
    """A clang link for Android: 16 KB pages, both hash styles (API < 23 needs SysV), SONAME, and
    ``DT_NEEDED`` for every library the undefined symbols come from (see :mod:`.android_needed`)."""
    flags = [f"--target={_clang_target(spec)}"]
    link_flags = ["-Wl,-z,max-page-size=16384", "-Wl,--build-id", "-Wl,--hash-style=both",
                  "-Wl,-z,now", "-Wl,-z,text", f"-Wl,-soname,{SONAME}"]
    ndk = _ndk_clang()
    if ndk:
        return _fcompile(ndk, flags, link_flags, with_libc=False)
    clang = require("clang", "clang", image="android")
    require("ld.lld", "lld", image="android")
    return _fcompile(clang, [*flags, "-fuse-ld=lld"], [*link_flags, "-nostdlib"], with_libc=True)


def _fcompile(clang: str, flags: list[str], link_flags: list[str], with_libc: bool) -> Callable[..., Any]:
    """``export_library`` link function: link, read undefined symbols, relink against stub providers."""

    def fcompile(output: str, objects: list[str], options: list[str] | None = None, **_: Any) -> None:
        import tempfile

        from tvm.support import cc

        from . import android_needed

        opts = [*flags, *link_flags, *(options or [])]
        cc.create_shared(output, objects, options=opts, cc=clang)
        undefined = android_needed.dynamic_symbols(output, defined=False)
        groups, local = android_needed.providers(undefined, with_libc), android_needed.local_symbols(undefined)
        if groups or local:
            with tempfile.TemporaryDirectory(prefix="forgekit-android-stubs-") as stubs:
                extra = android_needed.build_stubs(clang, flags, groups, stubs)
                if local:
                    extra.append(android_needed.build_local_object(clang, flags, local, stubs))
                cc.create_shared(output, [*objects, *extra], options=opts, cc=clang)

    fcompile.output_format = "so"  # type: ignore[attr-defined]
    return fcompile


def toolchain(spec: TargetSpec) -> dict[str, str]:
    tool = _ndk_clang() or "clang"
    return {"linker": tool, "linker_version": tool_version(tool), "android_api": str(API_LEVEL),
            "page_size": "16384"}


def export_options(spec: TargetSpec, opt_level: int) -> dict[str, Any]:
    return {}


def device(arch: str, log: Callable[[str], None] | None = None) -> None:
    """No device here runs Android code (Bionic, not glibc)."""
    return None
