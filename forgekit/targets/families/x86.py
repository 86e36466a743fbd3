"""x86-64 Linux: native on an x86-64 machine, cross-linked elsewhere."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

from .base import host_cxx, require, tool_version

if TYPE_CHECKING:
    from ..parse import TargetSpec

DESCRIPTION = "x86-64 Linux"
_CROSS = "x86_64-linux-gnu-g++"


def _cxx() -> str:
    return host_cxx() if os.uname().machine == "x86_64" else _CROSS


def linker(spec: TargetSpec) -> Callable[..., Any] | None:
    if os.uname().machine == "x86_64":
        require(host_cxx(), "g++")
        return None
    from tvm.support import cc

    return cc.cross_compiler(require(_CROSS, "g++-x86-64-linux-gnu"))


def toolchain(spec: TargetSpec) -> dict[str, str]:
    return {"linker": _cxx(), "linker_version": tool_version(_cxx())}
