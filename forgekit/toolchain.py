"""External tools forgekit drives (compilers, linkers, qemu, debootstrap, docker): found once, named well.

A missing tool is one line that names the Debian package (and the forgekit image that has it).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from .errors import ToolchainError


def require(tool: str, package: str, image: str | None = None) -> str:
    """Path of ``tool`` on PATH, or a one-line :class:`ToolchainError` saying how to get it."""
    path = shutil.which(tool)
    if path is None:
        where = f" or use the forgekit '{image}' image" if image else ""
        raise ToolchainError(f"'{tool}' is not installed: install the Debian package '{package}'{where}.")
    return path


def tool_version(tool: str) -> str:
    """First line of ``tool --version`` (empty when it cannot be run)."""
    path = shutil.which(tool)
    if not path:
        return ""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else ""


def host_cxx() -> str:
    """The C++ compiler TVM uses for native artifacts (``CXX`` or ``g++``)."""
    return os.environ.get("CXX", "g++")


def publish_build(scratch: "os.PathLike[str]", final: "os.PathLike[str]", stamp: str, text: str) -> None:
    """Make a finished build folder ``scratch`` the cache entry ``final`` in one rename, marked complete by the
    file ``stamp`` (``text``): a reader sees a whole build or none.  Another process that finished the same
    build first wins: its entry is as good."""
    from pathlib import Path

    scratch, final = Path(scratch), Path(final)
    (scratch / stamp).write_text(text)
    scratch.chmod(0o755)
    try:
        scratch.rename(final)
    except OSError:
        if not (final / stamp).is_file():
            raise
