"""Which compiler builds the cross runtime of a target tag, as a CMake toolchain file.

The compilers are those that link the target family's artifacts (:mod:`forgekit.targets.families`): GNU
cross compilers for aarch64 and armhf Linux, clang for Android, with the Android link flags of the
artifacts (16 KB pages for Android 15, ``-z now``/``-z text``, both hash styles for API < 23).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from ..errors import TargetError, ToolchainError
from ..targets import parse_target

#: Android API level of the runtime: the artifacts' (forgekit.targets.families.android.API_LEVEL)
ANDROID_API = 21
ANDROID_LINK_FLAGS = ("-Wl,-z,max-page-size=16384", "-Wl,--build-id", "-Wl,--hash-style=both", "-Wl,-z,now",
                      "-Wl,-z,text")


@dataclass(frozen=True)
class CrossToolchain:
    """A toolchain for one ABI."""

    name: str  #: ABI name: aarch64-linux-gnu, arm-linux-gnueabihf, android-arm64-v8a, android-armeabi-v7a
    cxx: str  #: the C++ compiler (its version goes into the cache key)
    cc: str
    package: str  #: Debian package (or what to set) when the compiler is missing
    processor: str  #: CMAKE_SYSTEM_PROCESSOR
    flags: tuple[str, ...] = ()
    link_flags: tuple[str, ...] = ()
    cmake_args: tuple[str, ...] = ()  #: extra -D options of the configure step
    ship: tuple[str, ...] = ()  #: files shipped with the libraries (absolute: from the toolchain)
    android: bool = False

    def cmake_file(self) -> str:
        """The CMake toolchain file; strip at link time (``-s``): the runtime goes onto small devices."""
        flags = " ".join(self.flags)
        link = " ".join(("-s", *self.link_flags))
        return "\n".join([
            # Android too is "Linux" to CMake here: its Android platform module wants an NDK layout of its own,
            # while the NDK's clang, given --target=<abi><api>, finds its sysroot and libc++ by itself
            "set(CMAKE_SYSTEM_NAME Linux)",
            f"set(CMAKE_SYSTEM_PROCESSOR {self.processor})",
            f'set(CMAKE_C_COMPILER "{self.cc}")', f'set(CMAKE_CXX_COMPILER "{self.cxx}")',
            f'set(CMAKE_C_FLAGS_INIT "{flags}")', f'set(CMAKE_CXX_FLAGS_INIT "{flags}")',
            f'set(FORGEKIT_LINK_FLAGS "{link}")',
            "set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)", ""])


def _gnu(triple: str, processor: str, package: str) -> CrossToolchain:
    return CrossToolchain(triple, f"{triple}-g++", f"{triple}-gcc", package, processor)


def _ndk() -> str:
    ndk = os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")
    if not ndk:
        raise ToolchainError("The Android runtime is C++ and needs Bionic's headers and libc++ from the Android NDK "
                             "(Debian packages neither): set ANDROID_NDK_HOME to an NDK (r23 or newer).")
    found = sorted(glob.glob(os.path.join(ndk, "toolchains", "llvm", "prebuilt", "*")))
    if not found or not os.path.isfile(os.path.join(found[0], "bin", "clang++")):
        raise ToolchainError(f"ANDROID_NDK_HOME='{ndk}' has no toolchains/llvm/prebuilt/*/bin/clang++: point it "
                             "at an NDK (r23 or newer).")
    return found[0]


def _android(abi: str, triple: str, processor: str, libcxx_dir: str) -> CrossToolchain:
    prebuilt = _ndk()
    clang = os.path.join(prebuilt, "bin", "clang")
    # libc++_shared.so: several shared libraries share one C++ runtime (exceptions cross them), so the NDK's
    # shared libc++ is linked and shipped next to them, as the NDK recommends for more than one library
    libcxx = os.path.join(prebuilt, "sysroot", "usr", "lib", libcxx_dir, "libc++_shared.so")
    return CrossToolchain(f"android-{abi}", clang + "++", clang, "the Android NDK (ANDROID_NDK_HOME)", processor,
                          flags=(f"--target={triple}{ANDROID_API}",),
                          link_flags=ANDROID_LINK_FLAGS, cmake_args=("-DANDROID_LOG=ON",), ship=(libcxx,), android=True)


def toolchain_for(tag: str) -> CrossToolchain:
    """The toolchain of a target tag or target string, or a one-line :class:`TargetError`."""
    spec = parse_target(tag)
    if not spec.is_cpu:
        raise TargetError(f"'{tag}' is not a CPU target: the cross runtime is CPU-only (aarch64, armhf, Android).")
    if spec.family == "armhf" or (spec.family == "arm" and spec.arch == "arm"):
        # Debian armhf's compiler defaults (ARMv7-A, VFPv3-D16, Thumb-2) run on every Raspberry Pi OS 32-bit
        # board; the runtime has no hot loops, the artifact's kernels use NEON themselves
        return _gnu("arm-linux-gnueabihf", "armv7l", "g++-arm-linux-gnueabihf")
    if spec.family == "arm" and spec.arch == "aarch64":
        return _gnu("aarch64-linux-gnu", "aarch64", "g++-aarch64-linux-gnu")
    if spec.family == "android":
        if spec.arch == "aarch64":
            return _android("arm64-v8a", "aarch64-linux-android", "aarch64", "aarch64-linux-android")
        return _android("armeabi-v7a", "armv7a-linux-androideabi", "armv7-a", "arm-linux-androideabi")
    raise TargetError(f"No cross runtime for '{tag}' ({spec.family} {spec.arch}): use a tag of the arm, armhf or "
                      "android families; x86-64 Linux installs the forgekit-runtime wheel (runtime/python/build_wheel.py).")
