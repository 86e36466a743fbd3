"""Staging an artifact for a device: a plaintext copy in a scratch folder, and the runner's result back.

An encrypted library is decrypted here, on the host: the device then needs neither the key nor the
password (a board, a qemu chroot and a child process alike).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..artifact.layout import LIBRARY_FILE, METADATA_FILE, library_digests, library_files, read_metadata
from ..errors import ForgekitError, VerificationError
from ..log import last_line
from ..runtime.integrity import check_digest


def stage_artifact(library: Path, meta_path: Path | None, dest: Path, key_path: str | None,
                   password: str | None) -> Path:
    """Copy the artifact into ``dest`` (created), decrypting an encrypted library; returns ``dest``."""
    from .. import crypto

    dest.mkdir(parents=True)
    meta = None
    if meta_path is not None:
        shutil.copy2(meta_path, dest / METADATA_FILE)
        meta = read_metadata(meta_path)
    # every instruction-set level goes along: the device's runtime picks the one its CPU runs
    names = library_files(meta) if library.name == LIBRARY_FILE else [LIBRARY_FILE]
    sources = [library if name == LIBRARY_FILE else library.parent / name for name in names]
    if not crypto.is_encrypted(library):
        # the user's files checked, so a damaged one is named as it is, not as its staged copy
        digests = library_digests(meta)
        for source in sources:
            check_digest(source, digests.get(source.name))
        for name, source in zip(names, sources):
            shutil.copy2(source, dest / name)
        return dest
    key_path, password = crypto.artifact_key(library, key_path, password)
    for name, source in zip(names, sources):
        crypto.decrypt_library(source, key_path, password, dest / name)
    if meta is not None:  # the plaintext libraries' sizes and digests: the runtimes check the sizes at load
        from ..artifact.encryption import rewrite_metadata

        rewrite_metadata(dest, encrypted=False)
    return dest


def save_inputs(path: Path, inputs: Sequence[Any]) -> None:
    """The runner's input file."""
    np.savez(path, **{f"arg{i}": np.asarray(a) for i, a in enumerate(inputs)})


def collect(proc: subprocess.CompletedProcess, outputs: Path, where: str) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The runner's outputs and timings, or the error it reported (its forgekit exit code) or a crash."""
    if proc.returncode != 0:
        message = last_line(proc.stderr)
        if 0 < proc.returncode < 64 and "Traceback (most recent call last)" not in proc.stderr:
            # a ForgekitError the runner reported with its exit code (an uncaught exception also exits 1)
            raise ForgekitError.from_code(proc.returncode, message)
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        if proc.returncode in (-4, 132):
            message = "illegal instruction: the code uses CPU features this CPU lacks"
        raise VerificationError(f"The artifact crashed ({where}, {how}): {message}")
    with np.load(outputs) as data:
        arrays = [data[f"out{i}"] for i in range(len(data.files))]
    return arrays, json.loads(proc.stdout.strip().splitlines()[-1])
