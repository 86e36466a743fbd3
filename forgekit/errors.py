"""One exception root for forgekit, with stable exit codes.

Library code raises a subclass of :class:`ForgekitError` for anything the *user* can fix (a missing file,
an unsupported operator, a bad target, a wrong input shape, an output directory that already exists).
The CLI prints ``str(error)`` as one line and exits with ``error.exit_code``; anything else is a bug
and keeps its traceback.  Exit codes are part of the public interface: scripts and the GitHub Action
branch on them, so never renumber an existing class.
"""

from __future__ import annotations


#: how the message of a refused index starts: the bounds checks compiled into every CPU artifact
#: (forgekit/passes/index_checks.py) raise it inside the model, the runtimes (Engine, the C API) turn it into
#: an InputError (exit 9)
INDEX_ERROR_MARKER = "Index out of range"


class ForgekitError(Exception):
    """Base of every user-facing forgekit error."""

    exit_code: int = 1

    @classmethod
    def from_code(cls, code: int, message: str) -> ForgekitError:
        """Rebuild an error reported by a child process (the most general class with that exit code)."""
        pending: list[type[ForgekitError]] = [ForgekitError]
        while pending:
            klass = pending.pop(0)
            if klass.exit_code == code:
                return klass(message)
            pending.extend(klass.__subclasses__())
        return ForgekitError(message)


class UsageError(ForgekitError, ValueError):
    """An argument has a value forgekit cannot use (bad option, bad combination)."""

    exit_code = 2


class ModelLoadError(ForgekitError):
    """The model file is missing, unreadable or not valid ONNX."""

    exit_code = 3


class UnsupportedOperatorError(ModelLoadError):
    """The model uses operators forgekit cannot import (the message lists all of them)."""

    exit_code = 4


class TargetError(ForgekitError, ValueError):
    """The target is unknown or malformed (the message lists the closest valid names)."""

    exit_code = 5


class CompileError(ForgekitError):
    """TVM failed to compile the model."""

    exit_code = 6


class ArtifactError(ForgekitError):
    """An artifact is missing, incomplete or corrupt."""

    exit_code = 7


class OutputExistsError(ArtifactError, ValueError):
    """The output path exists and overwriting was not requested (``--force``)."""

    exit_code = 8


class InputError(ForgekitError, ValueError):
    """Inference inputs do not match the model (count, name, shape or dtype)."""

    exit_code = 9


class ToolchainError(ForgekitError):
    """A compiler or linker needed for the target is not installed (the message names the package)."""

    exit_code = 10


class EncryptionError(ForgekitError):
    """Encryption or decryption failed (wrong password, foreign key file, tampered data...)."""

    exit_code = 11


class NotAvailableError(ForgekitError):
    """The feature exists in the API but is not available in this build or on this machine."""

    exit_code = 12


class VerificationError(ForgekitError):
    """An artifact's outputs differ from onnxruntime's on the same inputs, or it failed to run on its target."""

    exit_code = 13


class RPCError(ForgekitError):
    """A remote device over TVM RPC cannot be used: tracker or server unreachable, no server registered
    with the key, or the device's CPU is not the artifact's."""

    exit_code = 14


class OutputWriteError(ForgekitError):
    """An output cannot be written: no permission, a read-only file system, or no space left on the device.
    Nothing is left behind."""

    exit_code = 15


class IncompatibleArtifactError(ArtifactError):
    """The artifact was built for another machine: another CPU architecture or operating system, or CPU
    features (AVX-512, dot product...) that this CPU lacks.  Reported before any of its code runs."""

    exit_code = 16
