"""Encrypted model libraries: AES-256-GCM in authenticated chunks, a scrypt-protected key file, in-memory loading.

Typical use::

    from forgekit import crypto

    crypto.encrypt_library("out/model_library.so", "out/model_library.so", "out/modelKey.bin", password,
                           uuid=meta_uuid, fingerprint=model_fingerprint, target=target_str)
    data = crypto.decrypt_library_bytes("out/model_library.so", "out/modelKey.bin", password)

Bytes in, bytes out: loading a decrypted library from memory is :mod:`forgekit.runtime.memload`'s job.
The byte formats and the threat model are in ``docs/encryption-format.md``.  This package imports neither
``tvm`` nor any other forgekit module besides ``forgekit.errors``: deployment needs ``cryptography``,
``tvm_ffi`` and ``libtvm_runtime.so`` only.
"""

from __future__ import annotations

from .errors import (
    CorruptArtifactError,
    EmptyPasswordError,
    EncryptionError,
    KeyMismatchError,
    KeyRequiredError,
    NotEncryptedError,
    UnsupportedFormatError,
    WeakPasswordError,
    WrongPasswordError,
)
from .format import DEFAULT_CHUNK_SIZE, DEFAULT_KDF_N, DEFAULT_KDF_P, DEFAULT_KDF_R, FORMAT_VERSION, is_encrypted
from .password import DEFAULT_PASSWORD_ENV, MIN_PASSWORD_LENGTH, artifact_key, check_new_password, password_from_env_or_file

#: what :mod:`.core` provides, imported on first use: it needs ``cryptography``, which a plain artifact's Engine
#: does not (a GPU machine without it ran no artifact at all: ModuleNotFoundError at Engine())
_CORE = ("decrypt_library", "decrypt_library_bytes", "encrypt_library", "read_header", "read_key_info", "rekey")


def __getattr__(name: str) -> object:
    if name in _CORE:
        from . import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "encrypt_library",
    "decrypt_library_bytes",
    "decrypt_library",
    "rekey",
    "is_encrypted",
    "read_header",
    "read_key_info",
    "check_new_password",
    "MIN_PASSWORD_LENGTH",
    "password_from_env_or_file",
    "artifact_key",
    "DEFAULT_PASSWORD_ENV",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_KDF_N",
    "DEFAULT_KDF_R",
    "DEFAULT_KDF_P",
    "FORMAT_VERSION",
    "EncryptionError",
    "KeyRequiredError",
    "EmptyPasswordError",
    "WeakPasswordError",
    "WrongPasswordError",
    "KeyMismatchError",
    "CorruptArtifactError",
    "NotEncryptedError",
    "UnsupportedFormatError",
]
