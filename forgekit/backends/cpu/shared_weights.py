"""Weights stored once for the levels of a portable artifact: one ``model_weights.<id>.bin`` file they share.

Each level's library serves its weights from its own read-only data (:mod:`.weights`).  The levels below
x86-64-v4 pack their weights in v4's layout (:func:`forgekit.backends.cpu.tiling.layout_tile`), so most
arrays are the same bytes in every level: ResNet-50's 65 lifted arrays (132.6 MB) are, all but one, and a
portable artifact with three levels stored them three times (399 MB).  Here every array that two or more
levels hold goes once into a file next to the libraries; a level's ``forgekit_weight`` maps that file on its
first call (``mmap``, read-only, found next to the library itself through ``dladdr``) and serves tensors
pointing into it, as it does into its own data: still no copy, still page-cache pages shared by every
process.  Arrays only one level has stay in that level's library.

The file is ``[64-byte header][arrays, 64-byte aligned]``; the header (magic, body size, sha256 of the body)
is also compiled into every library that uses the file, which compares the two before serving anything: a
file of another model or build (same name, other bytes) is one error line, never wrong weights.  The name
carries the body's digest, so artifacts with different weights never share a file name (an RPC server's
shared upload directory).

Why a file and not a shared library the levels link against (``DT_NEEDED``): glibc matches a needed
library against the ``SONAME`` of every library already loaded, so two models in one process would silently
share the first one's weights unless every name were unique, and an encrypted artifact's libraries, loaded
from memory, have no directory to find it in.  Encrypted artifacts therefore keep each level's weights in
its own (encrypted) library.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ...artifact.layout import SHARED_WEIGHTS_CHECK
from .weights import ALIGN, WeightStore, content_key

MAGIC = b"FKWEIGHT"
VERSION = 1
HEADER_BYTES = 64
PREFIX = "model_weights"


_key = content_key


class SharedWeights:
    """The arrays held by two or more of ``stores`` (one :class:`WeightStore` per level), laid out in one file."""

    def __init__(self, stores: list[WeightStore]) -> None:
        self._keys: dict[int, tuple[str, tuple[int, ...], bytes]] = {}
        holders: dict[tuple[str, tuple[int, ...], bytes], int] = {}
        first: dict[tuple[str, tuple[int, ...], bytes], np.ndarray] = {}
        for store in stores:  # in the order of the levels and of their arrays: the same file from every build
            for key in dict.fromkeys(self._key_of(a) for a in store.arrays):
                holders[key] = holders.get(key, 0) + 1
            for array in store.arrays:
                first.setdefault(self._key_of(array), array)
        self.offsets: dict[tuple[str, tuple[int, ...], bytes], int] = {}
        self._arrays: list[np.ndarray] = []
        offset = 0
        for key, count in holders.items():
            if count < 2:
                continue
            offset += -offset % ALIGN
            self.offsets[key] = offset
            self._arrays.append(first[key])
            offset += first[key].nbytes
        self.body_bytes = offset
        digest = hashlib.sha256()
        for array, at in zip(self._arrays, self.offsets.values()):
            digest.update(struct.pack("<Q", at))
            digest.update(memoryview(np.ascontiguousarray(array)).cast("B"))
        self.digest = digest.digest()
        self.name = f"{PREFIX}.{self.digest.hex()[:16]}.bin"

    def __bool__(self) -> bool:
        return bool(self.offsets)

    def _key_of(self, array: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
        if id(array) not in self._keys:
            self._keys[id(array)] = _key(array)
        return self._keys[id(array)]

    def offset_of(self, array: np.ndarray) -> int | None:
        """Where ``array`` is in the file's body, or None when only one level has it."""
        return self.offsets.get(self._key_of(array))

    def used_by(self, store: WeightStore) -> bool:
        return any(self.offset_of(a) is not None for a in store.arrays)

    def header(self) -> bytes:
        head = MAGIC + struct.pack("<IIQ", VERSION, 0, self.body_bytes) + self.digest
        return head + b"\0" * (HEADER_BYTES - len(head))

    def write(self, directory: Path) -> Path:
        """Write the file into ``directory``; returns its path."""
        path = Path(directory) / self.name
        with open(path, "wb") as out:
            out.write(self.header())
            written = 0
            for array, at in zip(self._arrays, self.offsets.values()):
                out.write(b"\0" * (at - written))
                data = np.ascontiguousarray(array)
                out.write(memoryview(data).cast("B"))
                written = at + data.nbytes
        return path

    def c_prelude(self) -> str:
        """The C code a level's weights source (:meth:`WeightStore.sources`) starts with: ``fk_shared()``."""
        header = ", ".join(str(b) for b in self.header())
        text = _C_PRELUDE
        for key, value in (("@CHECK@", SHARED_WEIGHTS_CHECK), ("@FILE@", self.name), ("@HEADER@", header),
                           ("@BYTES@", str(HEADER_BYTES + self.body_bytes))):
            text = text.replace(key, value)
        return text


def build(stores: list[Any]) -> SharedWeights | None:
    """The shared weights of a portable artifact's levels (their stores, None where a level lifted none), or
    None when no array is in two of them."""
    present = [s for s in stores if s is not None]
    if len(present) < 2:
        return None
    shared = SharedWeights(present)
    return shared if shared else None


_C_PRELUDE = r"""/* Weights shared by the levels of a portable artifact (forgekit/backends/cpu/shared_weights.py): mapped
   from the file next to this library on first use, after its header matched the one below.

   Compiled freestanding like the rest of this file (weights.SOURCE_FLAGS): a target family's C library
   headers may be absent (Android linked by Debian's clang has none), so the six C library calls are
   declared here rather than included, with Linux's constants, which are the same on every architecture
   forgekit targets (x86-64, AArch64, ARMv7; glibc and Bionic alike); off_t is `long` there (no
   _FILE_OFFSET_BITS). */
#include <tvm/ffi/c_api.h>

#ifdef __cplusplus
extern "C" {
#endif
typedef struct {
  const char* dli_fname;
  void* dli_fbase;
  const char* dli_sname;
  void* dli_saddr;
} fk_dl_info; /* Dl_info, <dlfcn.h> */
int dladdr(const void* address, fk_dl_info* info);
int open(const char* path, int flags, ...);
int close(int fd);
long lseek(int fd, long offset, int whence);
void* mmap(void* address, size_t length, int protection, int flags, int fd, long offset);
int munmap(void* address, size_t length);
#ifdef __cplusplus
}
#endif
#define FK_O_RDONLY_CLOEXEC 02000000 /* O_RDONLY (0) | O_CLOEXEC */
#define FK_PROT_READ 1
#define FK_MAP_SHARED 1
#define FK_SEEK_END 2
#define FK_MAP_FAILED ((void*)-1)

#define FK_SHARED 1
static const char fk_shared_file[] = "@FILE@";
static const unsigned char fk_shared_header[64] = {@HEADER@};
static const uint64_t fk_shared_bytes = @BYTES@ULL;
static const char* fk_shared_map = NULL;

/* `text` appended at `at`, never past `end` (which stays writable for the terminating NUL) */
static char* fk_append(char* at, char* end, const char* text) {
  while (*text != '\0' && at < end) *at++ = *text++;
  return at;
}

static const char* fk_shared_fail(const char* what, const char* path) {
  char message[4608];
  char* end = message + sizeof message - 1;
  char* at = fk_append(message, end, "forgekit_weight: ");
  at = fk_append(at, end, what);
  at = fk_append(at, end, " ");
  at = fk_append(at, end, path);
  at = fk_append(at, end, ": the instruction-set levels of this portable artifact share their weights in that "
                 "file; keep it next to the model libraries (copy the whole artifact directory)");
  *at = '\0';
  TVMFFIErrorSetRaisedFromCStr("RuntimeError", message);
  return NULL;
}

static const char* fk_shared(void) {
  const char* map = __atomic_load_n(&fk_shared_map, __ATOMIC_ACQUIRE);
  if (map != NULL) return map + 64;
  fk_dl_info info;
  char path[4096];
  if (dladdr((const void*)fk_shared_header, &info) == 0 || info.dli_fname == NULL) {
    return fk_shared_fail("cannot locate the model library to find", fk_shared_file);
  }
  size_t dir = 0;
  for (size_t i = 0; info.dli_fname[i] != '\0'; ++i) {
    if (info.dli_fname[i] == '/') dir = i + 1;
  }
  if (dir + sizeof fk_shared_file > sizeof path) return fk_shared_fail("path too long for", fk_shared_file);
  for (size_t i = 0; i < dir; ++i) path[i] = info.dli_fname[i];
  for (size_t i = 0; i < sizeof fk_shared_file; ++i) path[dir + i] = fk_shared_file[i];
  int fd = open(path, FK_O_RDONLY_CLOEXEC);
  if (fd < 0) return fk_shared_fail("cannot open", path);
  if (lseek(fd, 0, FK_SEEK_END) != (long)fk_shared_bytes) {
    close(fd);
    return fk_shared_fail("wrong size: another build's or a damaged", path);
  }
  void* mapped = mmap(NULL, (size_t)fk_shared_bytes, FK_PROT_READ, FK_MAP_SHARED, fd, 0);
  close(fd);
  if (mapped == FK_MAP_FAILED) return fk_shared_fail("cannot map", path);
  for (size_t i = 0; i < sizeof fk_shared_header; ++i) {
    if (((const unsigned char*)mapped)[i] != fk_shared_header[i]) {
      munmap(mapped, (size_t)fk_shared_bytes);
      return fk_shared_fail("header mismatch: another build's", path);
    }
  }
  const char* expected = NULL;
  if (!__atomic_compare_exchange_n(&fk_shared_map, &expected, (const char*)mapped, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    munmap(mapped, (size_t)fk_shared_bytes); /* another thread mapped it first */
    return expected + 64;
  }
  return (const char*)mapped + 64;
}

/* forgekit's runtimes call this right after loading the library, so a missing or foreign file is a load
   error rather than one at the first inference */
#ifdef __cplusplus
extern "C"
#endif
__attribute__((visibility("default"))) int __tvm_ffi_@CHECK@(void* self, const TVMFFIAny* args,
                                                                             int32_t num_args, TVMFFIAny* result) {
  (void)self;
  (void)args;
  (void)num_args;
  if (fk_shared() == NULL) return -1;
  result->type_index = kTVMFFINone;
  result->zero_padding = 0;
  result->v_int64 = 0;
  return 0;
}

__attribute__((destructor)) static void fk_shared_unmap(void) {
  /* the library is unloaded: its tensors are gone with it (the VM holding them went first) */
  const char* map = __atomic_exchange_n(&fk_shared_map, (const char*)NULL, __ATOMIC_ACQ_REL);
  if (map != NULL) munmap((void*)map, (size_t)fk_shared_bytes);
}

"""
