"""What the CUDA library routes (:mod:`.cudnn`'s convolutions, :mod:`.cublas`'s matmuls) share: reading a
Relax value's static shape and dtype, the ``op`` / ``astype(op)`` patterns they rewrite into one
``call_dps_packed`` each, the single-reader check that keeps a value from being computed twice, where the CUDA
runtime's headers and library are, and the compiler wrapper that builds an extension's C++ source into the
artifact's library."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


def static_ints(values: Any) -> list[int] | None:
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        return None


def shape_of(expr: Any) -> list[Any] | None:
    shape = getattr(expr.ty, "shape", None)
    return list(shape.values) if shape is not None and hasattr(shape, "values") else None


def dtype_of(expr: Any) -> str:
    return str(getattr(expr.ty, "dtype", ""))


def cast_patterns(op: str, operands: tuple[str, str]) -> list[tuple[Any, dict[str, Any]]]:
    """``op(a, b)`` and ``astype(op(a, b))`` (an fp16 build's fp32 accumulator rounded to fp16), the cast first;
    each with its parts by name (``operands``, ``"op"``, ``"cast"``)."""
    from tvm.relax.dpl import is_op, wildcard

    out = []
    for cast in (True, False):
        parts = {name: wildcard() for name in operands}
        parts["op"] = is_op(op)(*(parts[name] for name in operands))
        if cast:
            parts["cast"] = is_op("relax.astype")(parts["op"])
        out.append((parts.get("cast", parts["op"]), parts))
    return out


def single_use(func: Any) -> Callable[[Any], bool]:
    """Whether a value of ``func`` is bound to a dataflow variable read exactly once: an fp32 result also read
    elsewhere must stay, or it would run twice (once in the call, once for that reader)."""
    from tvm import relax

    bound, uses = {}, {}
    for block in func.body.blocks:
        for binding in block.bindings:
            bound[binding.value] = binding.var
        if isinstance(block, relax.DataflowBlock):
            for var, users in relax.analysis.udchain(block).items():
                uses[var] = len(users) + (0 if isinstance(var, relax.DataflowVar) else 1)
    return lambda value: value in bound and uses.get(bound[value], 0) == 1


def rewrite_patterns(mod: Any, patterns: list[tuple[Any, dict[str, Any]]],
                      rewriter: Callable[[dict[str, Any], Callable[[Any], bool]], Callable[[Any, Any], Any]]) -> Any:
    """``mod`` with each Relax function rewritten by ``rewriter(parts, single_use)`` for every pattern."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import rewrite_call

    functions = dict(mod.functions.items())
    for gv, func in functions.items():
        if not isinstance(func, relax.Function):
            continue
        for pattern, parts in patterns:
            func = rewrite_call(pattern, rewriter(parts, single_use(func)), func)
        functions[gv] = func
    return tvm.IRModule(functions, attrs=mod.attrs)


def find_cudart(headers: tuple[str, ...] = (), libraries: tuple[str, ...] = ()) -> tuple[Path, Path] | None:
    """(include, lib) holding the CUDA runtime's ``cuda_runtime_api.h`` and ``libcudart.so.13`` and also
    ``headers`` and ``libraries`` (cuBLAS ships in the same folder): NVIDIA's ``cu13`` wheel folder or
    ``/usr/local/cuda``; None when no place has them all."""
    from ...runtime.device import nvidia_roots

    places = [(r / "cu13" / "include", r / "cu13" / "lib") for r in nvidia_roots()]
    places.append((Path("/usr/local/cuda/include"), Path("/usr/local/cuda/lib64")))
    return next(((inc, lib) for inc, lib in places
                 if all((inc / h).is_file() for h in ("cuda_runtime_api.h", *headers))
                 and all((lib / name).exists() for name in ("libcudart.so.13", *libraries))), None)


def extension_compiler(fcompile: Any, source: Path, flags: list[str], libraries: tuple[str, ...]) -> Any:
    """``fcompile`` (None: TVM's default g++) also compiling ``source`` into the library with ``flags`` (plus
    tvm-ffi's headers and this folder's), linked against ``libraries`` by soname: the runtime finds them where it
    runs (:func:`forgekit.runtime.device.ensure_cuda` loads them from NVIDIA's wheels), not where it was built."""
    import tvm_ffi
    from tvm.support import cc

    base = fcompile or cc.create_shared
    flags = [f"-I{Path(tvm_ffi.__file__).parent / 'include'}", f"-I{source.parent}", "-std=c++17", "-O2", *flags]
    # after the sources that use them (TVM puts options first, and Debian's g++ links --as-needed)
    names = [f"-l:{name}" for name in libraries]

    def compile_with_extension(output: str, objects: list[str], options: list[str] | None = None,
                               **kwargs: Any) -> Any:
        return base(output, [*objects, str(source), *names], options=[*(options or []), *flags], **kwargs)

    for attr in ("output_format", "get_target_triple", "object_format"):
        if hasattr(base, attr):
            setattr(compile_with_extension, attr, getattr(base, attr))
    return compile_with_extension
