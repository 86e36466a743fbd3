"""Pack a library's device modules with their CUDA kernels compiled (an ``fpack_imports`` hook).

``export_library`` embeds the modules a host module imports (the VM executable, CUDA kernels...) as one
byte blob, the ``__tvm_ffi__library_bin`` symbol.  Its layout (tvm-ffi's library module format) is::

    u64 payload size | u64[] import-tree row_ptr | u64[] child indices |
    per module: str kind, then (unless kind == "_lib", the shared library itself) bytes payload

with ``u64[]`` = u64 count + items, ``str``/``bytes`` = u64 length + data, all little-endian.  A CUDA
module's payload is ``str fmt | fmap | bytes code`` (``CUDAModuleNode::SaveToBytes``).  When TVM built
without a CUDA driver, ``fmt`` is ``"cuda"`` and ``code`` is CUDA C, which the device would have to
compile at load time.  :func:`compile_cuda_payloads` swaps in ``fmt = "fatbin"`` and nvcc's fatbin (the
runtime passes any format but ``"cuda"`` straight to ``cuModuleLoadData``); :func:`pack_imports` writes
the blob as an assembler file the target's own compiler assembles (``.incbin``: no huge C array).
"""

from __future__ import annotations

import os
import struct
from typing import Any, Callable

from ...errors import CompileError

_U64 = struct.Struct("<Q")
_SYMBOL = "__tvm_ffi__library_bin"


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def u64(self) -> int:
        if self.pos + 8 > len(self.data):
            raise CompileError("Unexpected TVM library blob layout (truncated): cannot pack CUDA kernels.")
        (value,) = _U64.unpack_from(self.data, self.pos)
        self.pos += 8
        return value

    def bytes(self) -> bytes:
        size = self.u64()
        if self.pos + size > len(self.data):
            raise CompileError("Unexpected TVM library blob layout (bad length): cannot pack CUDA kernels.")
        value = self.data[self.pos:self.pos + size]
        self.pos += size
        return value


def _str(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value


def compile_cuda_payloads(blob: bytes, compile_source: Callable[[str], bytes]) -> tuple[bytes, int]:
    """Return ``(new blob, number of CUDA modules compiled)``: every ``fmt == "cuda"`` module of
    ``blob`` gets ``compile_source(code)`` as a ``"fatbin"``."""
    reader = _Reader(blob)
    if reader.u64() != len(blob) - 8:
        raise CompileError("Unexpected TVM library blob layout (size header): cannot pack CUDA kernels.")
    row_ptr = [reader.u64() for _ in range(reader.u64())]
    children = [reader.u64() for _ in range(reader.u64())]
    out = [b"".join(_U64.pack(v) for v in [len(row_ptr), *row_ptr, len(children), *children])]
    compiled = 0
    while reader.pos < len(blob):
        kind = reader.bytes()
        out.append(_str(kind))
        if kind == b"_lib":
            continue
        payload = reader.bytes()
        if kind == b"cuda":
            new_payload = _compile_cuda_payload(payload, compile_source)
            compiled += new_payload is not payload
            payload = new_payload
        out.append(_str(payload))
    body = b"".join(out)
    return _U64.pack(len(body)) + body, compiled


def _compile_cuda_payload(payload: bytes, compile_source: Callable[[str], bytes]) -> bytes:
    reader = _Reader(payload)
    fmt = reader.bytes()
    if fmt != b"cuda":  # compiled at build time already (a CUDA driver was present): keep it
        return payload
    rest = payload[reader.pos:]
    # fmap is opaque to forgekit; ``code`` is the last field, so find the length prefix that spans
    # exactly to the end and holds text (CUDA C), scanning from the front of the remainder.
    for start in range(0, len(rest) - 7):
        (size,) = _U64.unpack_from(rest, start)
        if start + 8 + size == len(rest) and b'extern "C" __global__' in rest[start + 8:]:
            fmap, source = rest[:start], rest[start + 8:].decode()
            return _str(b"fatbin") + fmap + _str(compile_source(source))
    raise CompileError("Unexpected TVM CUDA module layout: cannot find its kernel source to compile.")


def pack_imports(compile_source: Callable[[str], bytes]) -> Callable[..., str]:
    """An ``fpack_imports`` for ``export_library`` that compiles CUDA source modules with
    ``compile_source`` and writes the blob as ``devc.S`` (assembled by the artifact's own linker)."""

    def fpack(mod: Any, is_system_lib: bool, prefix: str, workspace_dir: str) -> str:
        import tvm_ffi

        tensor = tvm_ffi.get_global_func("runtime.ModulePackImportsToTensor")(mod)
        blob, _ = compile_cuda_payloads(tensor.numpy().tobytes(), compile_source)
        bin_path = os.path.join(workspace_dir, f"{prefix}devc.bin")
        with open(bin_path, "wb") as handle:
            handle.write(blob)
        symbol = f"{prefix}{_SYMBOL}"
        asm_path = os.path.join(workspace_dir, f"{prefix}devc.S")
        # "a" section flags: read-only data; the symbol stays global with default visibility because
        # the runtime finds it with dlsym.  .balign 8 keeps the u64 header naturally aligned.
        with open(asm_path, "w") as handle:
            handle.write(f'\t.section .rodata.{symbol},"a"\n\t.balign 8\n\t.globl {symbol}\n'
                         f"\t.type {symbol}, %object\n{symbol}:\n\t.incbin \"{bin_path}\"\n"
                         f"\t.size {symbol}, {len(blob)}\n")
        return asm_path

    return fpack
