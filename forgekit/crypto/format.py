"""Byte layout of the encrypted library header and of the key file (format version 1).

Everything here is parsing and serialising: no keys are handled.  Parsing treats the input as hostile:
every length is bounded before anything is allocated, the JSON bodies are checked field by field, and
any failure becomes a :class:`CorruptArtifactError` (or :class:`UnsupportedFormatError` /
:class:`NotEncryptedError`), never a ``KeyError``/``ValueError``/``UnicodeDecodeError``.
See ``docs/encryption-format.md`` for the layout in prose.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable

from .errors import CorruptArtifactError, NotEncryptedError, UnsupportedFormatError

LIBRARY_MAGIC = b"\x89FKLIB\r\n"
KEY_MAGIC = b"\x89FKKEY\r\n"
FORMAT_VERSION = 1
CIPHER = "AES-256-GCM"
KDF = "scrypt"

DIGEST_SIZE = 32  # sha256
TAG_SIZE = 16  # AES-GCM tag
NONCE_SIZE = 12  # AES-GCM nonce
NONCE_PREFIX_SIZE = 8  # random part of each chunk nonce; the other 4 bytes are the chunk index
DATA_KEY_SIZE = 32
WRAPPED_KEY_SIZE = DATA_KEY_SIZE + TAG_SIZE
SALT_SIZE = 16
KEY_ID_SIZE = 16

_PREFIX = struct.Struct(">8sHI")  # magic, format version, JSON body length
PREFIX_SIZE = _PREFIX.size  # 14

MAX_HEADER_JSON = 64 * 1024
MAX_KEY_JSON = 16 * 1024
MAX_UUID = 256
MAX_FINGERPRINT = 1024
MAX_TARGET = 16 * 1024

DEFAULT_CHUNK_SIZE = 1 << 20
MIN_CHUNK_SIZE = 256
MAX_CHUNK_SIZE = 64 << 20
MAX_CHUNKS = 1 << 32  # the chunk index is 4 bytes of the nonce

# scrypt parameters.  The defaults cost about 170 ms and 64 MiB on a 2023 server core.  Key files are
# untrusted input, so the parameters read from one are capped (a hostile file must not make us
# allocate gigabytes or spin for minutes).
DEFAULT_KDF_N = 1 << 16
DEFAULT_KDF_R = 8
DEFAULT_KDF_P = 1
MAX_KDF_N = 1 << 20
MAX_KDF_R = 32
MAX_KDF_P = 16
MAX_KDF_MEMORY = 1 << 30  # 128 * n * r bytes


def is_encrypted(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a file that starts with the encrypted-library magic bytes.

    Cheap (reads 8 bytes) and never raises: a missing file, a directory or an unreadable file is
    ``False``.  It does not validate the rest of the file.  Here, not in :mod:`.core`, so that asking needs no
    ``cryptography``: the Engine asks it of every artifact, and a plain one runs without that package.
    """
    try:
        with open(path, "rb") as f:
            return f.read(len(LIBRARY_MAGIC)) == LIBRARY_MAGIC
    except OSError:
        return False


def canonical_json(obj: dict[str, Any]) -> bytes:
    """Deterministic ASCII JSON (sorted keys, no spaces) used for every body this module writes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def check_kdf_params(n: int, r: int, p: int, *, error: Callable[[str], Exception]) -> None:
    """Raise ``error(message)`` unless (n, r, p) are scrypt parameters within our caps."""
    if not (isinstance(n, int) and not isinstance(n, bool) and 2 <= n <= MAX_KDF_N and n & (n - 1) == 0):
        raise error(f"scrypt n={n!r} must be a power of two between 2 and {MAX_KDF_N}")
    if not (isinstance(r, int) and not isinstance(r, bool) and 1 <= r <= MAX_KDF_R):
        raise error(f"scrypt r={r!r} must be between 1 and {MAX_KDF_R}")
    if not (isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= MAX_KDF_P):
        raise error(f"scrypt p={p!r} must be between 1 and {MAX_KDF_P}")
    if 128 * n * r > MAX_KDF_MEMORY:
        raise error(f"scrypt n={n}, r={r} would need {128 * n * r >> 20} MiB (limit {MAX_KDF_MEMORY >> 20} MiB)")


# ---------------------------------------------------------------------------------------------- fields
def _corrupt(what: str, path: Path, detail: str) -> CorruptArtifactError:
    return CorruptArtifactError(f"{what} '{path}' is corrupt ({detail}): re-copy it from the original or "
                                f"re-encrypt the model.")


def _int_field(body: dict[str, Any], name: str, lo: int, hi: int, fail: Callable[[str], Exception]) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise fail(f"field '{name}' is not an integer in [{lo}, {hi}]")
    return value


def _str_field(body: dict[str, Any], name: str, max_len: int, fail: Callable[[str], Exception]) -> str:
    value = body.get(name)
    if not isinstance(value, str) or len(value) > max_len:
        raise fail(f"field '{name}' is not a string of at most {max_len} characters")
    return value


def _hex_field(body: dict[str, Any], name: str, size: int, fail: Callable[[str], Exception]) -> bytes:
    value = body.get(name)
    if not isinstance(value, str) or len(value) != 2 * size:
        raise fail(f"field '{name}' is not {size} hex bytes")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise fail(f"field '{name}' is not {size} hex bytes") from None


def _read_exact(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    return data if isinstance(data, bytes) else b""


def _read_prefix(stream: BinaryIO, path: Path, magic: bytes, what: str, max_json: int,
                 fail: Callable[[str], Exception]) -> tuple[bytes, bytes]:
    """Read and check magic, version and body length; return (prefix bytes, JSON body bytes)."""
    prefix = _read_exact(stream, PREFIX_SIZE)
    if len(prefix) < len(magic) or prefix[: len(magic)] != magic:
        other = KEY_MAGIC if magic == LIBRARY_MAGIC else LIBRARY_MAGIC
        if prefix[: len(other)] == other:
            kind = "a forgekit key file" if other == KEY_MAGIC else "an encrypted forgekit library"
            raise NotEncryptedError(f"'{path}' is {kind}, not {what}: check the order of the arguments.")
        raise NotEncryptedError(f"'{path}' is not {what} (wrong magic bytes): check the path, or the file is "
                                f"damaged.")
    if len(prefix) < PREFIX_SIZE:
        raise fail("truncated header")
    _, version, body_len = _PREFIX.unpack(prefix)
    if version != FORMAT_VERSION:
        raise UnsupportedFormatError(f"'{path}' uses format version {version}, this forgekit reads only version "
                                     f"{FORMAT_VERSION}: use a forgekit release that supports it.")
    if not 2 <= body_len <= max_json:
        raise fail(f"header length {body_len} out of range")
    body = _read_exact(stream, body_len)
    if len(body) != body_len:
        raise fail("truncated header")
    return prefix, body


def _parse_body(body: bytes, fail: Callable[[str], Exception]) -> dict[str, Any]:
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise fail("header is not valid JSON") from None
    if not isinstance(obj, dict):
        raise fail("header is not a JSON object")
    return obj


def _check_keys(obj: dict[str, Any], expected: frozenset[str], fail: Callable[[str], Exception]) -> None:
    if set(obj) != expected:
        raise fail(f"unexpected header fields {sorted(set(obj) ^ expected)}")


# ---------------------------------------------------------------------------------------------- library
_HEADER_FIELDS = frozenset({"chunk_size", "cipher", "fingerprint", "key_id", "nonce_prefix", "plaintext_size",
                            "target", "uuid"})


@dataclass(frozen=True)
class LibraryHeader:
    """The authenticated header of an encrypted library (nothing in it is secret)."""

    uuid: str
    fingerprint: str
    target: str
    key_id: bytes
    chunk_size: int
    plaintext_size: int
    nonce_prefix: bytes
    digest: bytes = b""  # sha256 of the header bytes: bound into every chunk's associated data
    size: int = 0  # bytes before the first chunk

    @property
    def num_chunks(self) -> int:
        """Number of chunks (an empty library still has one, empty, final chunk)."""
        return max(1, -(-self.plaintext_size // self.chunk_size))

    @property
    def ciphertext_size(self) -> int:
        return self.plaintext_size + TAG_SIZE * self.num_chunks

    def chunk_length(self, index: int) -> int:
        """Plaintext length of chunk ``index``."""
        return min(self.chunk_size, self.plaintext_size - index * self.chunk_size)

    def encode(self) -> bytes:
        """Header bytes (prefix, JSON, sha256), ready to be written before the chunks."""
        body = canonical_json({
            "chunk_size": self.chunk_size,
            "cipher": CIPHER,
            "fingerprint": self.fingerprint,
            "key_id": self.key_id.hex(),
            "nonce_prefix": self.nonce_prefix.hex(),
            "plaintext_size": self.plaintext_size,
            "target": self.target,
            "uuid": self.uuid,
        })
        head = _PREFIX.pack(LIBRARY_MAGIC, FORMAT_VERSION, len(body)) + body
        return head + hashlib.sha256(head).digest()

    def public(self) -> dict[str, Any]:
        """The header as a plain dict for display (``read_header``)."""
        return {
            "format_version": FORMAT_VERSION,
            "cipher": CIPHER,
            "uuid": self.uuid,
            "fingerprint": self.fingerprint,
            "target": self.target,
            "key_id": self.key_id.hex(),
            "chunk_size": self.chunk_size,
            "plaintext_size": self.plaintext_size,
            "num_chunks": self.num_chunks,
            "header_size": self.size,
        }


def read_library_header(stream: BinaryIO, path: Path, file_size: int | None = None) -> LibraryHeader:
    """Parse the header at the start of ``stream`` (left positioned on the first chunk).

    With ``file_size`` the total size is checked too, so truncation or extension is reported before any
    key derivation.  The header's integrity here rests on an unkeyed sha256 (it catches damage); its
    authenticity is established only when the chunks decrypt, since its digest is in their AAD.
    """
    def fail(detail: str) -> CorruptArtifactError:
        return _corrupt("Encrypted library", path, detail)

    prefix, body = _read_prefix(stream, path, LIBRARY_MAGIC, "an encrypted forgekit library", MAX_HEADER_JSON, fail)
    digest = _read_exact(stream, DIGEST_SIZE)
    if len(digest) != DIGEST_SIZE:
        raise fail("truncated header")
    if hashlib.sha256(prefix + body).digest() != digest:
        raise fail("header checksum mismatch")
    obj = _parse_body(body, fail)
    _check_keys(obj, _HEADER_FIELDS, fail)
    if obj["cipher"] != CIPHER:
        raise fail(f"unknown cipher {obj['cipher']!r}")
    header = LibraryHeader(
        uuid=_str_field(obj, "uuid", MAX_UUID, fail),
        fingerprint=_str_field(obj, "fingerprint", MAX_FINGERPRINT, fail),
        target=_str_field(obj, "target", MAX_TARGET, fail),
        key_id=_hex_field(obj, "key_id", KEY_ID_SIZE, fail),
        chunk_size=_int_field(obj, "chunk_size", MIN_CHUNK_SIZE, MAX_CHUNK_SIZE, fail),
        plaintext_size=_int_field(obj, "plaintext_size", 0, 1 << 60, fail),
        nonce_prefix=_hex_field(obj, "nonce_prefix", NONCE_PREFIX_SIZE, fail),
        digest=digest,
        size=len(prefix) + len(body) + DIGEST_SIZE,
    )
    if header.num_chunks > MAX_CHUNKS:
        raise fail("too many chunks")
    if file_size is not None and file_size != header.size + header.ciphertext_size:
        kind = "truncated" if file_size < header.size + header.ciphertext_size else "extended"
        raise fail(f"{kind}: {file_size} bytes, expected {header.size + header.ciphertext_size}")
    return header


# ---------------------------------------------------------------------------------------------- key file
_KEY_FIELDS = frozenset({"fingerprint", "kdf", "kdf_n", "kdf_p", "kdf_r", "key_id", "salt", "uuid", "wrap"})
KEY_FILE_MAX = PREFIX_SIZE + MAX_KEY_JSON + NONCE_SIZE + WRAPPED_KEY_SIZE + DIGEST_SIZE


@dataclass(frozen=True)
class KeyFile:
    """Contents of ``modelKey.bin``: the wrapped data key and the identity of the library it opens."""

    uuid: str
    fingerprint: str
    key_id: bytes
    kdf_n: int
    kdf_r: int
    kdf_p: int
    salt: bytes
    nonce: bytes = b""
    wrapped_key: bytes = b""

    def bound_bytes(self) -> bytes:
        """Prefix + JSON body: the associated data of the key wrap (everything but nonce and wrapped key)."""
        body = canonical_json({
            "fingerprint": self.fingerprint,
            "kdf": KDF,
            "kdf_n": self.kdf_n,
            "kdf_p": self.kdf_p,
            "kdf_r": self.kdf_r,
            "key_id": self.key_id.hex(),
            "salt": self.salt.hex(),
            "uuid": self.uuid,
            "wrap": CIPHER,
        })
        return _PREFIX.pack(KEY_MAGIC, FORMAT_VERSION, len(body)) + body

    def encode(self, bound: bytes) -> bytes:
        data = bound + self.nonce + self.wrapped_key
        return data + hashlib.sha256(data).digest()


def parse_key_file(data: bytes, path: Path) -> tuple[KeyFile, bytes]:
    """Parse ``modelKey.bin`` bytes; return the key file and the exact bytes bound into the wrap's AAD."""
    import io

    def fail(detail: str) -> CorruptArtifactError:
        return _corrupt("Key file", path, detail)

    stream = io.BytesIO(data)
    prefix, body = _read_prefix(stream, path, KEY_MAGIC, "a forgekit key file", MAX_KEY_JSON, fail)
    rest = data[len(prefix) + len(body):]
    if len(rest) != NONCE_SIZE + WRAPPED_KEY_SIZE + DIGEST_SIZE:
        raise fail("truncated" if len(rest) < NONCE_SIZE + WRAPPED_KEY_SIZE + DIGEST_SIZE else "trailing bytes")
    if hashlib.sha256(data[:-DIGEST_SIZE]).digest() != data[-DIGEST_SIZE:]:
        raise fail("checksum mismatch")
    obj = _parse_body(body, fail)
    _check_keys(obj, _KEY_FIELDS, fail)
    if obj["kdf"] != KDF or obj["wrap"] != CIPHER:
        raise fail(f"unknown algorithms {obj['kdf']!r}/{obj['wrap']!r}")
    key = KeyFile(
        uuid=_str_field(obj, "uuid", MAX_UUID, fail),
        fingerprint=_str_field(obj, "fingerprint", MAX_FINGERPRINT, fail),
        key_id=_hex_field(obj, "key_id", KEY_ID_SIZE, fail),
        kdf_n=_int_field(obj, "kdf_n", 2, MAX_KDF_N, fail),
        kdf_r=_int_field(obj, "kdf_r", 1, MAX_KDF_R, fail),
        kdf_p=_int_field(obj, "kdf_p", 1, MAX_KDF_P, fail),
        salt=_hex_field(obj, "salt", SALT_SIZE, fail),
        nonce=rest[:NONCE_SIZE],
        wrapped_key=rest[NONCE_SIZE:NONCE_SIZE + WRAPPED_KEY_SIZE],
    )
    check_kdf_params(key.kdf_n, key.kdf_r, key.kdf_p, error=fail)
    return key, prefix + body


# ---------------------------------------------------------------------------------------------- files
class AtomicWriter:
    """A temporary file next to ``path`` that replaces it only on :meth:`commit`.

    Use as a context manager: if the block raises, the temporary file is removed and ``path`` is left as
    it was (absent or with its old contents).  The file is created with mode 0600.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        fd, name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent or ".")
        self.tmp = Path(name)
        self.file: BinaryIO = os.fdopen(fd, "wb")

    def __enter__(self) -> "AtomicWriter":
        return self

    def flush(self) -> None:
        """Flush and fsync the temporary file (call before :meth:`commit`)."""
        if not self.file.closed:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()

    def commit(self) -> None:
        """Atomically move the temporary file onto ``path``."""
        self.flush()
        os.replace(self.tmp, self.path)
        self.tmp = None  # type: ignore[assignment]

    def discard(self) -> None:
        if not self.file.closed:
            self.file.close()
        if self.tmp is not None:
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass
            self.tmp = None  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        self.discard()
