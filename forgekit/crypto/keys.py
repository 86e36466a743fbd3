"""The key file side of the format: passwords to bytes, scrypt, wrapping and unwrapping the data key."""

from __future__ import annotations

import hashlib
import hmac
import os
import unicodedata
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from ..errors import UsageError
from . import format as fmt
from .errors import CorruptArtifactError, EmptyPasswordError, KeyRequiredError, WrongPasswordError
from .format import KeyFile
from .password import check_new_password

Password = str | bytes
PathLike = str | os.PathLike[str]

_KEY_ID_LABEL = b"forgekit/v1/key-id"


def _password_bytes(password: Password | None, *, purpose: str, new: bool = False) -> bytes:
    """UTF-8 bytes of the password (NFC-normalised when given as ``str``); ``new`` passwords (encrypting,
    re-keying) must also be long enough (:func:`check_new_password`)."""
    if password is None:
        raise KeyRequiredError(f"A password is needed to {purpose}: set FORGEKIT_ENCRYPT_PASSWORD or pass "
                               f"--password-file.")
    if isinstance(password, str):
        password = unicodedata.normalize("NFC", password).encode("utf-8")
    elif not isinstance(password, (bytes, bytearray)):
        raise UsageError(f"The password must be str or bytes, not {type(password).__name__}.")
    if not password:
        raise EmptyPasswordError(f"The password is empty: choose a non-empty password to {purpose}.")
    if new:
        check_new_password(bytes(password).decode("utf-8", errors="replace"))
    return bytes(password)


def _derive_kek(password: bytes, key: KeyFile) -> bytes:
    kdf = Scrypt(salt=key.salt, length=fmt.DATA_KEY_SIZE, n=key.kdf_n, r=key.kdf_r, p=key.kdf_p)
    return kdf.derive(password)


def _key_id(data_key: bytes) -> bytes:
    """Public identifier of a data key (HMAC-SHA256 under the key, truncated): a key-commitment value."""
    return hmac.new(data_key, _KEY_ID_LABEL, hashlib.sha256).digest()[: fmt.KEY_ID_SIZE]


def _wrap(key: KeyFile, password: bytes, data_key: bytes) -> bytes:
    """Key file bytes with ``data_key`` wrapped under the password (fresh nonce)."""
    bound = key.bound_bytes()
    nonce = os.urandom(fmt.NONCE_SIZE)
    wrapped = AESGCM(_derive_kek(password, key)).encrypt(nonce, data_key, bound)
    return KeyFile(**{**key.__dict__, "nonce": nonce, "wrapped_key": wrapped}).encode(bound)


def _read_key_file(key_path: PathLike | None, lib_path: Path | None) -> tuple[KeyFile, bytes]:
    if key_path is None:
        where = f"'{lib_path}' is encrypted" if lib_path else "A key file is required"
        raise KeyRequiredError(f"Model looks encrypted but no key provided: {where}; pass --key modelKey.bin "
                               f"and a password.")
    path = Path(key_path)
    try:
        with open(path, "rb") as f:
            data = f.read(fmt.KEY_FILE_MAX + 1)
    except FileNotFoundError:
        raise KeyRequiredError(f"Key file '{path}' does not exist: pass the modelKey.bin written when the model "
                               f"was encrypted.") from None
    except IsADirectoryError:
        raise KeyRequiredError(f"Key file '{path}' is a directory: pass the modelKey.bin file itself.") from None
    except OSError as exc:
        raise KeyRequiredError(f"Cannot read key file '{path}' ({exc.strerror or exc.__class__.__name__}): check "
                               f"its permissions.") from None
    if len(data) > fmt.KEY_FILE_MAX:
        raise CorruptArtifactError(f"Key file '{path}' is corrupt (too large): re-copy it from the original or "
                                   f"re-encrypt the model.")
    return fmt.parse_key_file(data, path)


def _unwrap(key: KeyFile, bound: bytes, password: bytes, key_path: Path) -> bytes:
    try:
        data_key = AESGCM(_derive_kek(password, key)).decrypt(key.nonce, key.wrapped_key, bound)
    except InvalidTag:
        raise WrongPasswordError(f"Wrong password for key file '{key_path}': check the password (or its "
                                 f"file/environment variable).") from None
    if not hmac.compare_digest(_key_id(data_key), key.key_id):
        raise CorruptArtifactError(f"Key file '{key_path}' is corrupt (key id does not match its key): re-copy it "
                                   f"from the original.")
    return data_key
