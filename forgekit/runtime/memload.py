"""Loading a model library from memory (``memfd_create``), so decrypted code never touches a disk.

Only ``tvm_ffi`` and ``libtvm_runtime.so`` are needed (no ``import tvm``).  The library bytes go into an
anonymous, sealed memory file; TVM's ``.so`` loader ``dlopen``s it through ``/proc/self/fd/N``; the file
descriptor is closed right after, and the kernel frees the memory when the module is unloaded.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any, Iterable

from ..errors import ArtifactError, NotAvailableError
from .loader import ensure_runtime

_SO_LOADER = "ffi.Module.load_from_file.so"

_lock = threading.Lock()
_counter = itertools.count()


def _get_loader() -> Any:
    """TVM FFI's ``.so`` module loader (a hook point for tests)."""
    import tvm_ffi

    return tvm_ffi.get_global_func(_SO_LOADER)


def _fd_path(fd: int) -> str:
    """A ``/proc/self/fd/N`` path spelled uniquely for this process.

    glibc's ``dlopen`` returns an already-loaded object when the *path string* matches one loaded before,
    so a second model loaded through a reused fd number would silently be the first model.  Each load
    therefore gets a different spelling of the same path: the bits of a counter written as ``./`` (0) or
    ``.//`` (1) segments, which the kernel resolves to the same file.
    """
    with _lock:
        n = next(_counter)
    return "/proc/self/fd/" + "".join("./" if bit == "0" else ".//" for bit in bin(n)[2:]) + str(fd)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _load_from_memfd(parts: Iterable[bytes | bytearray | memoryview], name: str) -> Any:
    if not hasattr(os, "memfd_create"):
        raise NotAvailableError("Loading a model from memory needs Linux memfd_create: it is not available on this "
                                "platform.")
    ensure_runtime()
    import fcntl

    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        for part in parts:
            _write_all(fd, part)
        try:  # nobody (not even this process) can change the code after this point
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
        except (AttributeError, OSError):
            pass
        try:
            return _get_loader()(_fd_path(fd), "so")
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ArtifactError(f"Cannot load the decrypted model library ({first}): check that it was compiled "
                                f"for this machine's target and TVM version.") from exc
    finally:
        os.close(fd)


def load_module_from_memory(data: bytes | bytearray | memoryview, name: str = "forgekit-model") -> Any:
    """Load a compiled model library (the bytes of a ``.so``) without writing it to any file system.

    The bytes are written to an anonymous ``memfd_create`` file (sealed against further writes) and
    loaded with the TVM FFI global ``ffi.Module.load_from_file.so`` through ``/proc/self/fd/N``; the
    descriptor is closed before returning.  ``libtvm_runtime.so`` is loaded first if needed, so this works
    with ``tvm_ffi`` alone (no ``import tvm``).

    Returns
    -------
    tvm_ffi.Module
        The library module: ``module["vm_load_executable"]()`` gives the Relax VM, or pass it to
        ``tvm.relax.VirtualMachine(module, tvm.cpu())``.

    Raises
    ------
    ArtifactError
        The bytes are not a loadable library for this machine, or libtvm_runtime.so is missing.
    NotAvailableError
        The platform has no ``memfd_create`` (not Linux).
    """
    return _load_from_memfd([data], name)


def load_encrypted_module(enc_path: str | os.PathLike[str], key_path: str | os.PathLike[str] | None,
                          password: str | bytes | None, name: str = "forgekit-model") -> Any:
    """Decrypt an encrypted library straight into memory and load it; the plaintext never touches disk.

    Chunks are decrypted and authenticated one at a time into the memory file, so peak memory is the
    library size plus one chunk (:func:`decrypt_library_bytes` + :func:`load_module_from_memory` needs
    twice the library size).  The library is loaded only after every chunk verified.

    Raises the errors of :func:`decrypt_library_bytes` and of :func:`load_module_from_memory`.
    """
    from ..crypto.core import _iter_plaintext

    _, chunks = _iter_plaintext(enc_path, key_path, password)
    return _load_from_memfd(chunks, name)

