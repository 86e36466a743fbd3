"""Encrypting, decrypting and re-keying compiled model libraries (see ``docs/encryption-format.md``)."""

from __future__ import annotations

import contextlib
import os
import struct
import uuid as uuid_module
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import ArtifactError, UsageError
from . import format as fmt
from .errors import (
    CorruptArtifactError,
    KeyMismatchError,
)
from .format import AtomicWriter, KeyFile, LibraryHeader, is_encrypted  # noqa: F401 (is_encrypted: older import path)
from .keys import _derive_kek, _key_id, _password_bytes, _read_key_file, _unwrap, _wrap  # noqa: F401

Password = str | bytes
PathLike = str | os.PathLike[str]

_CHUNK_AAD = struct.Struct(">QB")  # chunk index, final flag (after the 32-byte header digest)


# ---------------------------------------------------------------------------------------------- helpers
def _chunk_nonce(header: LibraryHeader, index: int) -> bytes:
    return header.nonce_prefix + index.to_bytes(4, "big")


def _chunk_aad(header: LibraryHeader, index: int, final: bool) -> bytes:
    return header.digest + _CHUNK_AAD.pack(index, int(final))


def _open_library(enc_path: PathLike) -> tuple[BinaryIO, LibraryHeader, Path]:
    path = Path(enc_path)
    try:
        stream = open(path, "rb")
    except FileNotFoundError:
        raise ArtifactError(f"Encrypted library '{path}' does not exist: check the path.") from None
    except IsADirectoryError:
        raise ArtifactError(f"'{path}' is a directory, not an encrypted library: pass the library file.") from None
    except OSError as exc:
        raise ArtifactError(f"Cannot read encrypted library '{path}' ({exc.strerror or exc.__class__.__name__}): "
                            f"check its permissions.") from None
    try:
        header = fmt.read_library_header(stream, path, os.fstat(stream.fileno()).st_size)
    except BaseException:
        stream.close()
        raise
    return stream, header, path


def _check_match(header: LibraryHeader, key: KeyFile, lib_path: Path, key_path: Path) -> None:
    if key.uuid != header.uuid or key.fingerprint != header.fingerprint:
        raise KeyMismatchError(
            f"Key file '{key_path}' belongs to another model (uuid {key.uuid}, fingerprint {key.fingerprint}) than "
            f"'{lib_path}' (uuid {header.uuid}, fingerprint {header.fingerprint}): pass that model's key file.")
    if key.key_id != header.key_id:
        raise KeyMismatchError(
            f"Key file '{key_path}' is from another encryption of this model (key id {key.key_id.hex()}, the library "
            f"needs {header.key_id.hex()}): pass the key file written together with '{lib_path}'.")


def _decrypt_chunk(aead: AESGCM, nonce: bytes, blob: memoryview, aad: bytes, out: memoryview) -> None:
    if hasattr(aead, "decrypt_into"):  # cryptography >= 45: no per-chunk allocation
        aead.decrypt_into(nonce, blob, aad, out)
    else:  # pragma: no cover - older cryptography
        out[:] = aead.decrypt(nonce, bytes(blob), aad)


def _encrypt_chunk(aead: AESGCM, nonce: bytes, block: memoryview, aad: bytes, out: memoryview) -> memoryview:
    if hasattr(aead, "encrypt_into"):
        aead.encrypt_into(nonce, block, aad, out)
        return out
    return memoryview(aead.encrypt(nonce, bytes(block), aad))  # pragma: no cover - older cryptography


def _iter_plaintext(enc_path: PathLike, key_path: PathLike | None, password: Password | None,
                    whole: bool = False) -> tuple[LibraryHeader, Iterator[memoryview]]:
    """Validate everything up to the data key, then return (header, generator of plaintext chunks).

    Each chunk is authenticated before it is yielded; truncation, extension and reordering are caught by
    the final-chunk flag and the chunk index in the AAD, so the generator raises
    :class:`CorruptArtifactError` before its end if anything is wrong.  A consumer must not *use* the
    plaintext until the generator is exhausted.  The yielded memoryviews point into one reused chunk
    buffer (valid until the next step) or, with ``whole``, into one buffer of the plaintext's size (its
    ``.obj``), so the complete plaintext is assembled without copies.
    """
    stream, header, lib_path = _open_library(enc_path)
    try:
        key, bound = _read_key_file(key_path, lib_path)
        secret = _password_bytes(password, purpose="decrypt the model")
        _check_match(header, key, lib_path, Path(key_path))  # type: ignore[arg-type]
        data_key = _unwrap(key, bound, secret, Path(key_path))  # type: ignore[arg-type]
    except BaseException:
        stream.close()
        raise

    def chunks() -> Iterator[memoryview]:
        aead = AESGCM(data_key)
        n = header.num_chunks
        first = header.chunk_length(0)
        blob = memoryview(bytearray(first + fmt.TAG_SIZE))
        target = memoryview(bytearray(header.plaintext_size if whole else first))
        with stream:
            offset = 0
            for index in range(n):
                length = header.chunk_length(index)
                piece = blob[:length + fmt.TAG_SIZE]
                if stream.readinto(piece) != len(piece):
                    raise CorruptArtifactError(f"Encrypted library '{lib_path}' is corrupt (truncated while "
                                               f"reading chunk {index}): re-copy it from the original.")
                out = target[offset:offset + length] if whole else target[:length]
                try:
                    _decrypt_chunk(aead, _chunk_nonce(header, index), piece, _chunk_aad(header, index, index == n - 1),
                                   out)
                except InvalidTag:
                    raise CorruptArtifactError(
                        f"Encrypted library '{lib_path}' is corrupt or was tampered with (chunk {index} of {n} "
                        f"fails authentication): re-copy it from the original or re-encrypt the model.") from None
                offset += length
                yield out
            if stream.read(1):
                raise CorruptArtifactError(f"Encrypted library '{lib_path}' is corrupt (trailing bytes): re-copy "
                                           f"it from the original.")

    return header, chunks()


# ---------------------------------------------------------------------------------------------- public API
def encrypt_library(plain_path: PathLike, out_path: PathLike, key_path: PathLike, password: Password, *,
                    uuid: str | uuid_module.UUID | None, fingerprint: str, target: str,
                    chunk_size: int = fmt.DEFAULT_CHUNK_SIZE, kdf_n: int = fmt.DEFAULT_KDF_N,
                    kdf_r: int = fmt.DEFAULT_KDF_R, kdf_p: int = fmt.DEFAULT_KDF_P,
                    also: Sequence[tuple[PathLike, PathLike]] = ()) -> dict[str, Any]:
    """Encrypt a compiled model library and write its key file.

    A fresh random 256-bit data key encrypts ``plain_path`` with AES-256-GCM in chunks of ``chunk_size``
    bytes (streamed: memory stays bounded whatever the library size).  The data key is wrapped with a key
    derived from ``password`` by scrypt(``kdf_n``, ``kdf_r``, ``kdf_p``) and written to ``key_path``
    (``modelKey.bin``).  Both files are written atomically (a temporary file in the same directory, then
    ``os.replace``, the key file first); if anything fails before the renames neither output is created
    or changed.  ``out_path`` may equal ``plain_path`` to encrypt in place; an already encrypted library is
    refused (:class:`UsageError`).

    Parameters
    ----------
    plain_path:
        The library exported by TVM (``model_library.so``).
    out_path:
        Where to write the encrypted library.
    key_path:
        Where to write the key file; it must differ from both other paths.
    password:
        ``str`` (NFC-normalised, UTF-8) or ``bytes``; never empty.  Take it from
        :func:`password_from_env_or_file`, not from the command line.
    uuid, fingerprint, target:
        The model's artifact uuid (``None`` generates one), model fingerprint and target string.  They are
        stored in the clear in the authenticated header and in the key file, so a key file of another
        model is reported as such (:class:`KeyMismatchError`).
    chunk_size:
        Plaintext bytes per chunk (256 B – 64 MiB, default 1 MiB).
    kdf_n, kdf_r, kdf_p:
        scrypt cost (default n=2**16, r=8, p=1: about 170 ms and 64 MiB per derivation).  Lower values are
        for tests only.
    also:
        More (plaintext, encrypted) library pairs encrypted under the same data key and key file: the
        instruction-set levels of a portable artifact.

    Returns
    -------
    dict
        The public header, as :func:`read_header` returns it.

    Raises
    ------
    EmptyPasswordError, KeyRequiredError
        For an empty or missing password.
    UsageError
        For bad parameters (paths that coincide, chunk size or KDF cost out of range, over-long fields).
    ArtifactError
        When ``plain_path`` does not exist.
    """
    secret = _password_bytes(password, purpose="encrypt the model", new=True)
    plain, out, key_out = Path(plain_path), Path(out_path), Path(key_path)
    pairs = [(plain, out), *((Path(a), Path(b)) for a, b in also)]
    for source, _ in pairs:
        if not source.is_file():
            raise ArtifactError(f"Library '{source}' does not exist or is not a file: compile the model first.")
    for parent in {out.parent, key_out.parent}:
        if not parent.is_dir():
            raise ArtifactError(f"Output directory '{parent}' does not exist: create it first.")
    for source, _ in pairs:
        if is_encrypted(source):  # encrypting twice in place would overwrite the only key of the inner layer
            raise UsageError(f"'{source}' is already an encrypted forgekit library: encrypt the plaintext library, "
                             f"or use rekey to change the password.")
    if key_out.resolve() in (plain.resolve(), out.resolve()):
        raise UsageError(f"The key file '{key_out}' must not be the library itself: write it to a separate path "
                         f"such as modelKey.bin.")
    if not (isinstance(chunk_size, int) and fmt.MIN_CHUNK_SIZE <= chunk_size <= fmt.MAX_CHUNK_SIZE):
        raise UsageError(f"chunk_size {chunk_size!r} must be between {fmt.MIN_CHUNK_SIZE} and {fmt.MAX_CHUNK_SIZE}.")
    fmt.check_kdf_params(kdf_n, kdf_r, kdf_p, error=lambda m: UsageError(f"Bad KDF cost: {m}."))
    uuid_str = str(uuid) if uuid is not None else str(uuid_module.uuid4())
    for name, value, limit in (("uuid", uuid_str, fmt.MAX_UUID), ("fingerprint", fingerprint, fmt.MAX_FINGERPRINT),
                               ("target", target, fmt.MAX_TARGET)):
        if not isinstance(value, str) or len(value) > limit:
            raise UsageError(f"{name} must be a string of at most {limit} characters.")

    data_key = AESGCM.generate_key(bit_length=256)
    key_id = _key_id(data_key)
    key = KeyFile(uuid=uuid_str, fingerprint=fingerprint, key_id=key_id, kdf_n=kdf_n, kdf_r=kdf_r,
                  kdf_p=kdf_p, salt=os.urandom(fmt.SALT_SIZE))
    key_bytes = _wrap(key, secret, data_key)
    aead = AESGCM(data_key)
    with contextlib.ExitStack() as stack:
        key_w = stack.enter_context(AtomicWriter(key_out))
        writers, headers = [], []
        # Every library gets its own header and random nonce prefix under the one data key (2**-64 chance
        # of a prefix collision per pair), so one key file and one password open all levels of an artifact.
        for src_path, dst_path in pairs:
            writer = stack.enter_context(AtomicWriter(dst_path))
            headers.append(_encrypt_file(src_path, writer, aead, uuid_str, fingerprint, target, key_id, chunk_size))
            writers.append(writer)
        key_w.file.write(key_bytes)
        for writer in writers:
            writer.flush()
        key_w.flush()
        # key first: when encrypting in place, a failure between the renames must not leave an encrypted
        # library whose key was never written (the plaintext would be lost)
        key_w.commit()
        for writer in writers:
            writer.commit()
    return headers[0].public()


def _encrypt_file(plain: Path, lib_w: AtomicWriter, aead: AESGCM, uuid_str: str, fingerprint: str, target: str,
                  key_id: bytes, chunk_size: int) -> LibraryHeader:
    """Write the header and the encrypted chunks of ``plain`` (checked by the caller) to ``lib_w``, not
    committed."""
    with open(plain, "rb") as src:
        size = os.fstat(src.fileno()).st_size
        header = LibraryHeader(uuid=uuid_str, fingerprint=fingerprint, target=target, key_id=key_id,
                               chunk_size=chunk_size, plaintext_size=size,
                               nonce_prefix=os.urandom(fmt.NONCE_PREFIX_SIZE))
        head = header.encode()
        header = LibraryHeader(**{**header.__dict__, "digest": head[-fmt.DIGEST_SIZE:], "size": len(head)})
        if header.num_chunks > fmt.MAX_CHUNKS:
            raise UsageError(f"The library is too large for chunk size {chunk_size}: use a larger chunk size.")
        lib_w.file.write(head)
        n = header.num_chunks
        block_buf = memoryview(bytearray(header.chunk_length(0)))
        out_buf = memoryview(bytearray(header.chunk_length(0) + fmt.TAG_SIZE))
        for index in range(n):
            length = header.chunk_length(index)
            block = block_buf[:length]
            if src.readinto(block) != length:
                raise ArtifactError(f"Library '{plain}' changed size while it was being encrypted: retry.")
            lib_w.file.write(_encrypt_chunk(aead, _chunk_nonce(header, index), block,
                                            _chunk_aad(header, index, index == n - 1),
                                            out_buf[:length + fmt.TAG_SIZE]))
        if src.read(1):
            raise ArtifactError(f"Library '{plain}' changed size while it was being encrypted: retry.")
    return header


def decrypt_library_bytes(enc_path: PathLike, key_path: PathLike | None, password: Password | None) -> bytes:
    """Decrypt an encrypted library into memory and return the plaintext library bytes.

    Nothing is written to disk.  Every chunk is authenticated; the bytes are returned only when the whole
    library (header, every chunk, chunk order and count) verified.

    Raises
    ------
    ArtifactError
        ``enc_path`` does not exist.
    NotEncryptedError
        ``enc_path`` is not an encrypted forgekit library (a subclass of :class:`CorruptArtifactError`).
    UnsupportedFormatError
        The library or key file has an unknown format version.
    KeyRequiredError
        No key file / no password given, or the key file does not exist.
    EmptyPasswordError
        The password is empty.
    KeyMismatchError
        The key file belongs to another model or to another encryption of this model.
    WrongPasswordError
        The password does not open the key file.
    CorruptArtifactError
        The library or key file is truncated, extended or altered.
    """
    _, chunks = _iter_plaintext(enc_path, key_path, password, whole=True)
    view = memoryview(b"")
    for view in chunks:
        pass
    return bytes(view.obj)


def decrypt_library(enc_path: PathLike, key_path: PathLike | None, password: Password | None,
                    out_path: PathLike) -> None:
    """Decrypt an encrypted library to the file ``out_path`` (streamed; written atomically).

    The plaintext goes to a temporary file next to ``out_path`` (mode 0600) that replaces ``out_path`` only
    once every chunk has been authenticated; on any error the temporary file is removed.  Note that this
    *does* put the plaintext library on disk: to run a model use :func:`load_encrypted_module`.

    Raises the same errors as :func:`decrypt_library_bytes`.
    """
    if not Path(out_path).parent.is_dir():
        raise ArtifactError(f"Output directory '{Path(out_path).parent}' does not exist: create it first.")
    header, chunks = _iter_plaintext(enc_path, key_path, password)
    try:
        with AtomicWriter(Path(out_path)) as writer:
            for block in chunks:
                writer.file.write(block)
            writer.commit()
    finally:
        chunks.close()  # type: ignore[attr-defined]


def rekey(key_path: PathLike, old_password: Password, new_password: Password, *, kdf_n: int = fmt.DEFAULT_KDF_N,
          kdf_r: int = fmt.DEFAULT_KDF_R, kdf_p: int = fmt.DEFAULT_KDF_P) -> None:
    """Change the password of a key file: re-wrap the same data key under ``new_password``.

    The encrypted library is not touched (it is encrypted with the data key, which does not change).  A
    new salt and nonce are drawn, and the KDF cost is set to ``kdf_n``/``kdf_r``/``kdf_p``.  The key file is
    replaced atomically.  Copies of the old key file still open the library with the old password: delete
    them.

    Raises
    ------
    KeyRequiredError
        The key file does not exist, or a password is ``None``.
    EmptyPasswordError
        ``old_password`` or ``new_password`` is empty.
    WrongPasswordError
        ``old_password`` is wrong.
    CorruptArtifactError, UnsupportedFormatError
        The key file is damaged or of an unknown version.
    """
    old = _password_bytes(old_password, purpose="open the key file")
    new = _password_bytes(new_password, purpose="re-key the model", new=True)
    fmt.check_kdf_params(kdf_n, kdf_r, kdf_p, error=lambda m: UsageError(f"Bad KDF cost: {m}."))
    path = Path(key_path)
    key, bound = _read_key_file(path, None)
    data_key = _unwrap(key, bound, old, path)
    fresh = KeyFile(uuid=key.uuid, fingerprint=key.fingerprint, key_id=key.key_id, kdf_n=kdf_n, kdf_r=kdf_r,
                    kdf_p=kdf_p, salt=os.urandom(fmt.SALT_SIZE))
    data = _wrap(fresh, new, data_key)
    with AtomicWriter(path) as writer:
        writer.file.write(data)
        writer.commit()


def read_header(path: PathLike) -> dict[str, Any]:
    """The public header of an encrypted library, without any key or password.

    Returns ``format_version``, ``cipher``, ``uuid``, ``fingerprint``, ``target``, ``key_id`` (a public
    identifier of the data key), ``chunk_size``, ``plaintext_size``, ``num_chunks`` and ``header_size``.
    The header's checksum and the file size are verified, but its authenticity is only proven by a full
    decryption (its digest is in every chunk's associated data).

    Raises ``ArtifactError`` (missing file), :class:`NotEncryptedError`, :class:`UnsupportedFormatError`
    or :class:`CorruptArtifactError`.
    """
    stream, header, _ = _open_library(path)
    stream.close()
    return header.public()


def read_key_info(key_path: PathLike) -> dict[str, Any]:
    """The public fields of a key file: uuid, fingerprint, key_id and KDF parameters (no secrets)."""
    key, _ = _read_key_file(key_path, None)
    return {"format_version": fmt.FORMAT_VERSION, "uuid": key.uuid, "fingerprint": key.fingerprint,
            "key_id": key.key_id.hex(), "kdf": fmt.KDF, "kdf_n": key.kdf_n, "kdf_r": key.kdf_r, "kdf_p": key.kdf_p}
