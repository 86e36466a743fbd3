"""DT_NEEDED entries for Android artifacts, from stub libraries (what the NDK does for Bionic).

TVM's generated code calls a few TVM FFI C functions (``TVMFFIErrorSetRaisedFromCStrParts``...).  On
Linux they resolve because Python loads ``libtvm_ffi.so`` with ``RTLD_GLOBAL``; Android's loader only
searches the main executable's global group and the library's *own* ``DT_NEEDED`` tree (per linker
namespace), and an app's JNI libraries are not global.  So the artifact must name the libraries that
provide every symbol it leaves undefined: ``libtvm_ffi.so`` (shipped next to it in the APK),
``libtvm_runtime.so``, and Bionic's ``libc.so``/``libm.so`` when linked without the NDK.

We link once, read the undefined symbols, build an empty stub per provider with the right ``DT_SONAME``
and link again against the stubs: the stubs are never shipped, only their names are recorded.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections import defaultdict

from ...errors import ToolchainError

# C math functions: Bionic has them in libm.so (everything else of libc's is in libc.so).
_LIBM = re.compile(r"^(a?(sin|cos|tan)h?|atan2|exp2?|expm1|log(2|10|1p)?|pow|sqrt|cbrt|hypot|erfc?|[tl]gamma|"
                   r"fmod|remainder|l?l?round|trunc|floor|ceil|l?l?rint|nearbyint|fabs|fmin|fmax|fma|copysign|"
                   r"ldexp|frexp|modf|scalbn)[fl]?$")


@functools.lru_cache(maxsize=1)
def _tvm_exports() -> dict[str, str]:
    """symbol -> TVM runtime library that exports it (read from the installed x86 builds: same names)."""
    import tvm
    import tvm_ffi

    libs = [os.path.join(os.path.dirname(tvm_ffi.__file__), "lib", "libtvm_ffi.so"),
            os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime.so")]
    exports: dict[str, str] = {}
    for lib in libs:
        if os.path.exists(lib):
            for name in dynamic_symbols(lib, defined=True):
                exports.setdefault(name, os.path.basename(lib))
    return exports


def _readelf() -> str:
    for tool in ("llvm-readelf", "readelf"):
        if shutil.which(tool):
            return tool
    raise ToolchainError("'readelf' is not installed: install the Debian package 'binutils' or 'llvm'.")


def dynamic_symbols(path: str, defined: bool) -> list[str]:
    """Global (non-weak) dynamic symbols of an ELF file: defined ones, or undefined ones."""
    out = subprocess.run([_readelf(), "--dyn-syms", "-W", path], capture_output=True, text=True, check=True).stdout
    names = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 8 or not fields[0].rstrip(":").isdigit() or fields[4] != "GLOBAL":
            continue
        if (fields[6] == "UND") != defined:
            names.append(fields[7].split("@")[0])
    return names


# ARM EHABI personality routines, referenced by every armv7 object's unwind table.  TVM code reports
# errors through return codes and never throws, so they are never called: the artifact defines them
# itself (hidden) instead of depending on an unwinder library.
_LOCAL = re.compile(r"^__aeabi_unwind_cpp_pr[0-2]$")


def local_symbols(undefined: list[str]) -> list[str]:
    """Undefined symbols the artifact should define itself (see ``_LOCAL``)."""
    return sorted({name for name in undefined if _LOCAL.match(name)})


def providers(undefined: list[str], with_libc: bool) -> dict[str, list[str]]:
    """Group undefined symbols by the Android library that provides them."""
    groups: dict[str, list[str]] = defaultdict(list)
    exports = _tvm_exports()
    for name in sorted(set(undefined)):
        if _LOCAL.match(name):
            continue
        if name in exports:
            groups[exports[name]].append(name)
        elif with_libc:
            groups["libm.so" if _LIBM.match(name) else "libc.so"].append(name)
    return dict(groups)


def build_stubs(clang: str, flags: list[str], groups: dict[str, list[str]], workdir: str) -> list[str]:
    """Compile one empty shared library per provider (``DT_SONAME`` = its name); returns their paths."""
    paths = []
    for soname, symbols in groups.items():
        src = os.path.join(workdir, f"{soname}.c")
        with open(src, "w") as handle:
            handle.writelines(f"void {name}(void) {{}}\n" for name in symbols)
        out = os.path.join(workdir, soname)
        subprocess.run([clang, *flags, "-shared", "-nostdlib", "-fPIC", f"-Wl,-soname,{soname}", "-o", out, src],
                       check=True, capture_output=True, text=True)
        paths.append(out)
    return paths


def build_local_object(clang: str, flags: list[str], symbols: list[str], workdir: str) -> str:
    """An object defining ``symbols`` as hidden no-op functions (see ``_LOCAL``)."""
    src, out = os.path.join(workdir, "forgekit_local.c"), os.path.join(workdir, "forgekit_local.o")
    with open(src, "w") as handle:
        handle.writelines(f'__attribute__((visibility("hidden"))) void {name}(void) {{}}\n' for name in symbols)
    subprocess.run([clang, *flags, "-c", "-fPIC", "-o", out, src], check=True, capture_output=True, text=True)
    return out
