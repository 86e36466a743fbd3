"""The runtime a published bundle carries for its device (``publish(..., with_runtime=True)``).

Targets with a cross-built runtime (aarch64 and armhf Linux, Android: :mod:`forgekit.deploy.cross`) get
``runtime/`` with ``libtvm_ffi.so``, ``libtvm_runtime.so``, ``libforgekit_runtime.so``, ``forgekit-run`` and
the C/C++ headers, so a board needs neither Python nor forgekit: unpack, then
``./runtime/forgekit-run . -i x.npy -o out/`` in the bundle's folder (``forgekit-run`` finds its libraries
next to itself, ``$ORIGIN``).  Other targets (x86-64, where the ``forgekit-runtime`` wheel exists; CUDA) get
no binaries, and their card names the wheel instead.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ..errors import TargetError
from .archive import FILE_MODE, Member

RUNTIME_DIR = "runtime"
HEADERS = ("forgekit_runtime.h", "forgekit_runtime.hpp")
EXEC_MODE = 0o755


def runtime_members(target: str, log: Callable[[str], None] | None = None) -> list[Member]:
    """The bundle members of ``target``'s device runtime; [] for a target that installs the wheel instead."""
    from ..deploy.capi import SOURCE_DIR
    from ..deploy.cross import build_cross_runtime
    from ..deploy.cross_toolchains import toolchain_for

    try:
        toolchain_for(target)
    except TargetError:
        return []
    build = build_cross_runtime(target, log=log)
    members = [Member(f"{RUNTIME_DIR}/{path.name}", path, EXEC_MODE if os.access(path, os.X_OK) else FILE_MODE)
               for path in build.files]
    members += [Member(f"{RUNTIME_DIR}/include/{name}", SOURCE_DIR / "include" / name) for name in HEADERS]
    return sorted(members, key=lambda m: m.name)


def device_commands(bundle: str, members: list[Member], inputs: list[dict[str, Any]],
                    encrypted: bool) -> dict[str, Any] | None:
    """The card's "Run it on the device" section, three commands with this model's inputs; None without
    binaries.  The cross-built runtime has no OpenSSL, so the card says an encrypted bundle needs the wheel."""
    if not members:
        return None
    names = [str(t.get("name")) for t in inputs]
    files = " ".join(f"{n}.npy" for n in names)
    args = " ".join(f"-i {n}={n}.npy" for n in names)
    return {"commands": [f"scp {bundle}.tar.gz {files} device:    # from your machine; inputs saved with numpy.save",
                         f"tar xzf {bundle}.tar.gz                 # on the device",
                         f"./{bundle}/{RUNTIME_DIR}/forgekit-run {bundle} {args} -o out/   # out/<output>.npy"],
            "encrypted": encrypted, "include": f"{RUNTIME_DIR}/include", "lib": RUNTIME_DIR}
