"""Encrypting and decrypting an artifact *directory* (the byte formats are :mod:`forgekit.crypto`'s).

Encrypting in place rewrites the library and ``metadata.json`` (its ``encrypted`` flag, sha256 and size);
decrypting writes a plaintext copy through the output gate, the original untouched.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..errors import UsageError
from . import metadata as md
from .layout import (KEY_FILE, LIBRARY_FILE, METADATA_FILE, artifact_dir, file_digest, library_files, read_metadata,
                     shared_weights_file)
from .outputs import atomic_directory


def rewrite_metadata(directory: Path, encrypted: bool) -> None:
    """Re-render ``metadata.json`` after the library changed (encrypted flag, sha256 and size)."""
    meta = read_metadata(directory)
    sha, size = file_digest(directory / LIBRARY_FILE)
    meta["library"].update({"encrypted": encrypted, "sha256": sha, "size": size})
    for entry in meta["library"].get("variants") or []:
        entry["sha256"], entry["size"] = file_digest(directory / entry["file"])
    (directory / METADATA_FILE).write_text(md.render_metadata(**{k: v for k, v in meta.items() if k != "schema"}))


def encrypt_artifact(artifact: str | os.PathLike[str], password: str) -> Path:
    """Encrypt an artifact's library in place and write ``modelKey.bin`` next to it; returns the key file."""
    from .. import crypto

    directory = artifact_dir(artifact)
    library = directory / LIBRARY_FILE
    if crypto.is_encrypted(library):
        raise UsageError(f"'{artifact}' is already encrypted.")
    meta = read_metadata(directory)
    if shared_weights_file(meta):
        # its levels map that file from their own directory, which a library loaded from memory has none of
        raise UsageError(f"'{artifact}' keeps the weights its instruction-set levels share in "
                         f"{shared_weights_file(meta)}, which cannot be encrypted in place: compile it again "
                         "with --encrypt (each level's library then holds its own weights, encrypted).")
    others = [directory / name for name in library_files(meta)[1:]]
    crypto.encrypt_library(library, library, directory / KEY_FILE, password, uuid=meta["uuid"],
                           fingerprint=meta["model"]["fingerprint"], target=meta["build"]["target_name"],
                           also=[(p, p) for p in others])
    rewrite_metadata(directory, encrypted=True)
    return directory / KEY_FILE


def decrypt_artifact(artifact: str | os.PathLike[str], output: str | os.PathLike[str], password: str,
                     key_path: str | os.PathLike[str] | None = None, force: bool = False) -> Path:
    """Write a decrypted copy of an encrypted artifact to ``output``; returns its path."""
    from .. import crypto

    directory = artifact_dir(artifact)
    key = Path(key_path) if key_path else directory / KEY_FILE
    with atomic_directory(output, force, kind="artifact", inputs=[directory, key]) as tmp:
        for name in library_files(read_metadata(directory)):
            crypto.decrypt_library(directory / name, key, password, tmp / name)
        shutil.copy2(directory / METADATA_FILE, tmp / METADATA_FILE)
        rewrite_metadata(tmp, encrypted=False)
    return Path(output).absolute()
