"""The encryption errors: all subclasses of :class:`forgekit.errors.EncryptionError` (exit code 11).

Each message is one line that says what is wrong and what to do about it.  Callers that only care
whether decryption worked catch ``EncryptionError``; the subclasses let the CLI and tests tell the
cases apart.
"""

from __future__ import annotations

from ..errors import EncryptionError

__all__ = [
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


class KeyRequiredError(EncryptionError):
    """The library is encrypted but no key file or no password was given, or the key file is missing."""


class EmptyPasswordError(EncryptionError):
    """The password is the empty string (never a valid password, for encrypting or decrypting)."""


class WeakPasswordError(EncryptionError):
    """A password for a new encryption is shorter than the minimum length."""


class WrongPasswordError(EncryptionError):
    """The key file is intact but the password does not unwrap its data key."""


class KeyMismatchError(EncryptionError):
    """The key file belongs to another model, or to another encryption of the same model."""


class CorruptArtifactError(EncryptionError):
    """The encrypted library or the key file is truncated, extended or has changed bytes."""


class NotEncryptedError(CorruptArtifactError):
    """The file is not a forgekit encrypted library (or key file) at all: its magic bytes are wrong.

    A subclass of :class:`CorruptArtifactError` because a damaged magic number and a file of another
    kind cannot be told apart.
    """


class UnsupportedFormatError(EncryptionError):
    """The file is a forgekit encrypted library or key file in a format version this forgekit cannot read."""
