"""aarch64 Linux (Raspberry Pi 3/4/5 64-bit, Jetson CPUs, Graviton): GNU cross toolchain."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

from .base import host_cxx, require, tool_version

if TYPE_CHECKING:
    from ..parse import TargetSpec

DESCRIPTION = "aarch64 Linux"
CROSS_CXX = "aarch64-linux-gnu-g++"
PACKAGE = "g++-aarch64-linux-gnu"


def _cxx() -> str:
    return host_cxx() if os.uname().machine == "aarch64" else CROSS_CXX


def linker(spec: TargetSpec) -> Callable[..., Any] | None:
    if os.uname().machine == "aarch64":
        require(host_cxx(), "g++")
        return None
    from tvm.support import cc

    return cc.cross_compiler(require(CROSS_CXX, PACKAGE, image="aarch64"))


def toolchain(spec: TargetSpec) -> dict[str, str]:
    return {"linker": _cxx(), "linker_version": tool_version(_cxx())}
