"""What the runtime loads is what ``compile`` wrote: each file's sha256 against ``metadata.json``, and a
library replaced on disk loaded anew.

A flipped byte in a plain library loaded and ran (once returning [1, 0]); only ``publish`` compared digests.
The runtime now reads each library file (and the weights file a portable artifact's levels share) once
before loading it and refuses a mismatch with one line (ArtifactError, exit 7).  Cost: one sequential read
and SHA-256 of the file, about 1 GB/s on this 2-core Zen VM (hashlib, 200 MiB in 0.19 s): MiniLM's 90 MB
library took 170 ms to load instead of 50 (a busy machine, 3 fresh processes each); a file already checked in this process (same inode, size and modification
time) is not read again, so engines created again on the same artifact pay nothing.  Encrypted libraries
are skipped: AES-GCM authenticates every chunk as it is decrypted (:mod:`forgekit.crypto`).

glibc's ``dlopen`` returns the object already loaded under the same path string, so an ``Engine`` created
again for an artifact recompiled at the same path ran the old weights.  :func:`load_path` spells the path
differently (``dir/./name``, ``dir/././name``, ...) for each file identity (device, inode, size, mtime) seen
at that path: a replaced file is a new object, an unchanged one is shared.  The weights file of a portable
artifact is found next to the library through ``dladdr`` (:mod:`forgekit.backends.cpu.shared_weights`),
which these spellings keep pointing at the same directory.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from ..artifact.layout import file_digest, library_digests
from ..errors import ArtifactError

_lock = threading.Lock()
#: (realpath, identity) already checked against a digest -> that digest
_CHECKED: dict[tuple[str, tuple[int, ...]], str] = {}
#: realpath -> {identity: the path spelling that file is loaded under}
_SPELLINGS: dict[str, dict[tuple[int, ...], str]] = {}


def _identity(path: str) -> tuple[int, ...]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def check_digest(path: Path, expected: str | None) -> None:
    """One line (ArtifactError) when the file at ``path`` does not hash to ``expected`` (None: nothing
    recorded, nothing checked)."""
    if not expected:
        return
    real = os.path.realpath(path)
    key = (real, _identity(real))
    with _lock:
        if _CHECKED.get(key) == expected:
            return
    actual, _ = file_digest(Path(real))
    if actual != expected:
        raise ArtifactError(f"'{path}' does not match the sha256 in its metadata.json ({actual[:12]}... instead of "
                            f"{expected[:12]}...): the file is damaged or was changed after compile; copy the "
                            "artifact again or recompile it.")
    with _lock:
        _CHECKED[key] = expected


def check_files(meta: dict[str, Any], library: Path, names: list[str]) -> None:
    """:func:`check_digest` for ``library`` and the files ``names`` next to it that the metadata records."""
    digests = library_digests(meta)
    check_digest(library, digests.get(library.name))
    for name in names:
        if digests.get(name) and (library.parent / name).is_file():
            check_digest(library.parent / name, digests[name])


def load_path(path: Path) -> str | None:
    """The path to ``dlopen`` ``path`` with: the same string for the same file, another one once the file at
    ``path`` was replaced (see the module docstring).  None when the file was overwritten in place (``cp`` onto
    it: the same inode) after this process loaded it: glibc would hand back the old mapping under any name, so
    the caller loads the bytes from memory instead."""
    real = os.path.realpath(path)
    ident = _identity(real)
    with _lock:
        seen = _SPELLINGS.setdefault(real, {})
        if ident not in seen and any(old[:2] == ident[:2] for old in seen):
            return None
        if ident not in seen:
            head, name = os.path.split(real)
            seen[ident] = os.path.join(head, *(["."] * len(seen)), name)
        return seen[ident]
