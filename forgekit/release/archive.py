"""Bit-reproducible ``.tar.gz`` archives (the bundles written by ``forgekit publish``).

Two archives of the same files must have the same sha256, whoever builds them, wherever and whenever:
members are sorted, every timestamp is one fixed ``mtime`` (``SOURCE_DATE_EPOCH`` in practice), owners
are ``0/0 root/root``, modes are fixed per member instead of copied from the builder's umask, and the
gzip header carries neither a file name nor a timestamp.
"""

from __future__ import annotations

import gzip
import tarfile
from dataclasses import dataclass
from pathlib import Path

#: Modes used in archives: regular files are world-readable, secrets are owner-only.
FILE_MODE = 0o644
DIR_MODE = 0o755
SECRET_MODE = 0o600


@dataclass(frozen=True)
class Member:
    """One file of an archive: its path inside the top-level directory, where to read it, its mode."""

    name: str
    source: Path
    mode: int = FILE_MODE


def _info(name: str, mtime: int, mode: int, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.size = 0 if directory else size
    info.mtime = mtime
    info.mode = mode
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def write_reproducible_tar_gz(path: Path, top: str, members: list[Member], mtime: int) -> None:
    """Write ``path``: a directory ``top/`` holding ``members`` (sorted by name), all dated ``mtime``.

    The tar stream is PAX (long names stay deterministic) and gzip runs at level 9 with ``mtime=0`` and
    an empty file name, so the output depends only on ``top``, the members' names, modes and bytes, and
    ``mtime``.
    """
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate archive members in {names}")
    with open(path, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_info(f"{top}/", mtime, DIR_MODE, directory=True))
        for member in sorted(members, key=lambda m: m.name):
            size = member.source.stat().st_size
            with open(member.source, "rb") as handle:
                tar.addfile(_info(f"{top}/{member.name}", mtime, member.mode, size), handle)


def read_member(path: Path, name: str) -> bytes:
    """The bytes of member ``name`` of the archive at ``path`` (used by tests and the Action)."""
    with tarfile.open(path, "r:gz") as tar:
        handle = tar.extractfile(name)
        if handle is None:
            raise KeyError(name)
        return handle.read()

