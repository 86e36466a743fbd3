"""Convolutions through NVIDIA's cuDNN on CUDA targets (phase 1 of :mod:`.pipeline`, "library dispatch").

Every 2-D convolution cuDNN computes exactly as the graph does, together with its epilogue, becomes one call
into ``ext/forgekit_cudnn.cc``, which :func:`with_extension` compiles into the artifact's library::

    conv2d(x, w) [-> astype(x.dtype), the fp16/bf16 builds' fp32 accumulator] [+ bias] [+ residual] [-> relu]
      =>  R.call_dps_packed("forgekit_cudnn_conv2d", (x, w, [bias], [residual], attrs), out)

The class it covers: NCHW/OIHW and NHWC (forgekit's ``--layout last``: HWIO weights, turned into cuDNN's
OHWI here) in fp32 and fp16; any groups (depthwise included), strides, dilations and symmetric
padding; symbolic batch and spatial sizes (cuDNN plans each shape it meets at run time). fp32 stays exact
(FMA kernels only, no TF32); fp16 uses tensor cores and round once, after the epilogue, where the graph
rounded after the convolution and again after each add (the error only shrinks). Asymmetric padding,
other layouts and convolutions whose fp32 result feeds a fp32 consumer keep TVM's kernels.

Why measured: on an H200, DLight's implicit-GEMM convolutions ran ResNet-50 at batch 32 in 18.6 ms (fp32)
and MobileNetV2 in 68 ms (depthwise), where PyTorch (cuDNN) took 11.3 and 2.9 ms (``../shared/notes/gpu.md``).
Why not TVM's ``partition_for_cudnn``: its codegen (``relax.ext.cudnn``) and runtime are not in the apache-tvm
wheel; its patterns also stop at conv+bias(+relu) and miss the fp16 cast and the residual add.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

#: the packed function's symbol in the artifact (``__tvm_ffi_`` + this)
FUNCTION = "forgekit_cudnn_conv2d"
SOURCE = Path(__file__).parent / "ext" / "forgekit_cudnn.cc"
#: shared libraries the extension needs at run time (NVIDIA's nvidia-cudnn-cu13 and nvidia-cuda-runtime wheels)
LIBRARIES = ("libcudnn.so.9", "libcudart.so.13")
_FLOATS = ("float32", "float16")  # bf16 is a CPU precision in forgekit
# attribute order of ext/forgekit_cudnn.cc's `attrs`
_LAYOUT, _NHWC = 0, 1


def _static_ints(values: Any) -> list[int] | None:
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        return None


def _shape(expr: Any) -> list[Any] | None:
    shape = getattr(expr.ty, "shape", None)
    return list(shape.values) if shape is not None and hasattr(shape, "values") else None


def _dtype(expr: Any) -> str:
    return str(getattr(expr.ty, "dtype", ""))


def _weight(w: Any, layout: str) -> Any | None:
    """The weight as cuDNN reads it (OIHW for NCHW, OHWI for NHWC); an HWIO constant is transposed here."""
    import tvm
    from tvm import relax

    if layout in ("OIHW", "OHWI"):
        return w
    if layout == "HWIO" and isinstance(w, tvm.ir.expr.Constant):
        return relax.const(np.ascontiguousarray(w.value.numpy().transpose(3, 0, 1, 2)))
    return None


def _bias(b: Any, channels: int, nhwc: bool, dtype: str) -> Any | None:
    """A constant bias broadcast along the channel axis only, as a (C,) constant of the output's dtype."""
    import tvm
    from tvm import relax

    if not isinstance(b, tvm.ir.expr.Constant):
        return None
    array = b.value.numpy()
    if array.size != channels or (array.ndim == 4 and array.shape[3 if nhwc else 1] != channels) \
            or (array.ndim == 3 and nhwc) or (array.ndim not in (1, 3, 4)) or (array.ndim == 1 and not nhwc):
        return None
    return relax.const(array.reshape(channels).astype(dtype))


def _patterns() -> list[tuple[Any, dict[str, Any]]]:
    """conv2d [astype] [+ const bias] [+ residual] [relu]: all 16 chains, longest first (a chain's prefix
    matches only convolutions the longer ones left)."""
    from tvm.relax.dpl import is_const, is_op, wildcard

    out = []
    for cast, bias, residual, relu in sorted(itertools.product((True, False), repeat=4), key=lambda f: -sum(f)):
        # the values between the convolution and the chain's end (``_inner``) must have no other reader
        parts = {"x": wildcard(), "w": wildcard()}
        chain = [is_op("relax.nn.conv2d")(parts["x"], parts["w"])]
        parts["conv"] = chain[0]
        if cast:
            chain.append(is_op("relax.astype")(chain[-1]))
            parts["cast"] = chain[-1]
        if bias:
            parts["bias"] = is_const()
            chain.append(is_op("relax.add")(chain[-1], parts["bias"]))
        if residual:
            parts["residual"] = wildcard()
            chain.append(is_op("relax.add")(chain[-1], parts["residual"]))
        if relu:
            chain.append(is_op("relax.nn.relu")(chain[-1]))
            parts["relu"] = chain[-1]
        out.append((chain[-1], {**parts, "_inner": chain[:-1]}))
    return out


def _single_use(func: Any) -> Callable[[Any], bool]:
    """Whether a value of ``func`` is bound to a dataflow variable read exactly once: a chain's inner values
    must be, or the convolution would run twice (MobileNetV2's ``add(projection, block)`` matched the
    projection's conv with the later block as its residual, while the projection also fed the next block:
    57 cuDNN calls for 52 convolutions)."""
    from tvm import relax

    bound, uses = {}, {}
    for block in func.body.blocks:
        for binding in block.bindings:
            bound[binding.value] = binding.var
        if isinstance(block, relax.DataflowBlock):
            for var, users in relax.analysis.udchain(block).items():
                uses[var] = len(users) + (0 if isinstance(var, relax.DataflowVar) else 1)
    return lambda value: value in bound and uses.get(bound[value], 0) == 1


def _rewriter(parts: dict[str, Any], tensor_ops: bool, single_use: Callable[[Any], bool]) -> Callable[[Any, Any], Any]:
    from tvm import relax

    def rewrite(expr: Any, matched: Any) -> Any:
        if not all(single_use(matched[inner]) for inner in parts["_inner"]):
            return expr
        conv = matched[parts["conv"]]
        attrs, x = conv.attrs, matched[parts["x"]]
        dtype, out_dtype = _dtype(x), _dtype(expr)
        nhwc = attrs.data_layout == "NHWC"
        pads, strides, dilation = (_static_ints(v) for v in (attrs.padding, attrs.strides, attrs.dilation))
        shape, x_shape = _shape(expr), _shape(x)
        if (dtype not in _FLOATS or _dtype(matched[parts["w"]]) != dtype or out_dtype != dtype
                or attrs.data_layout not in ("NCHW", "NHWC") or attrs.out_layout not in ("", attrs.data_layout)
                or (nhwc and attrs.kernel_layout == "OIHW") or (not nhwc and attrs.kernel_layout != "OIHW")
                or None in (pads, strides, dilation, shape, x_shape) or len(shape) != 4
                or pads[0] != pads[2] or pads[1] != pads[3]):
            return expr
        # without the cast the convolution's own dtype is the output's (an fp32 result of fp16 inputs feeding a
        # fp32 op stays TVM's: cuDNN writes the inputs' dtype)
        if _dtype(conv) != dtype and "cast" not in parts:
            return expr
        w = _weight(matched[parts["w"]], str(attrs.kernel_layout))
        channels = _static_ints([shape[3 if nhwc else 1]])
        if w is None or channels is None:
            return expr
        args = [x, w]
        if "bias" in parts:
            bias = _bias(matched[parts["bias"]], channels[0], nhwc, dtype)
            if bias is None:
                return expr
            args.append(bias)
        if "residual" in parts:
            residual = matched[parts["residual"]]
            if _dtype(residual) != dtype or _shape(residual) is None or \
                    [str(d) for d in _shape(residual)] != [str(d) for d in shape]:
                return expr
            args.append(residual)
        flags = [int(nhwc), pads[0], pads[1], *strides, *dilation, int(attrs.groups),
                 int("bias" in parts), int("residual" in parts), int("relu" in parts),
                 int(tensor_ops or dtype != "float32")]
        args.append(relax.ShapeExpr(flags))
        return relax.call_dps_packed(FUNCTION, relax.Tuple(args), out_ty=expr.ty)

    return rewrite


def route_convolutions(mod: Any, tensor_ops: bool) -> Any:
    """``mod`` with every convolution chain cuDNN computes exactly as one call (see the module docstring);
    ``tensor_ops``: whether fp32 may use TF32 tensor cores (fp16 always uses them)."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import rewrite_call

    functions = dict(mod.functions.items())
    for gv, func in functions.items():
        if not isinstance(func, relax.Function):
            continue
        for pattern, parts in _patterns():
            func = rewrite_call(pattern, _rewriter(parts, tensor_ops, _single_use(func)), func)
        functions[gv] = func
    return tvm.IRModule(functions, attrs=mod.attrs)


def route_convolutions_pass() -> Any:
    """:func:`route_convolutions` as a module pass: tensor cores for fp16, FMA (exact) for fp32."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="forgekit.CudnnConvolutions")
    def route(mod: Any, _ctx: Any) -> Any:
        return route_convolutions(mod, tensor_ops=False)

    return route


def calls_cudnn(executable: Any) -> bool:
    """Whether a built Relax executable calls the extension (so its library must carry it)."""
    return FUNCTION in executable.as_text()


@dataclass(frozen=True)
class CudnnKit:
    """Where this machine's cuDNN 9 headers and library are (NVIDIA's pip wheels, or a CUDA install)."""

    include: Path
    lib: Path
    cudart_include: Path
    cudart_lib: Path


def _nvidia_roots() -> list[Path]:
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def find_cudnn() -> CudnnKit | None:
    """cuDNN's ``cudnn.h`` and ``libcudnn.so.9`` and the CUDA runtime's headers and ``libcudart.so.13``, from
    NVIDIA's wheels (``nvidia-cudnn-cu13``, ``nvidia-cuda-runtime``) or ``/usr``; None when any is missing."""
    cudnn = [(r / "cudnn" / "include", r / "cudnn" / "lib") for r in _nvidia_roots()]
    cudart = [(r / "cu13" / "include", r / "cu13" / "lib") for r in _nvidia_roots()]
    system = (Path("/usr/include"), Path("/usr/lib/x86_64-linux-gnu"))
    kit = next(((i, lib) for i, lib in [*cudnn, system] if (i / "cudnn.h").is_file()
                and (lib / "libcudnn.so.9").exists()), None)
    rt = next(((i, lib) for i, lib in [*cudart, (Path("/usr/local/cuda/include"), Path("/usr/local/cuda/lib64"))]
               if (i / "cuda_runtime_api.h").is_file() and (lib / "libcudart.so.13").exists()), None)
    return CudnnKit(kit[0], kit[1], rt[0], rt[1]) if kit and rt else None


def with_extension(fcompile: Any) -> Any:
    """``fcompile`` (None: TVM's default g++) also compiling ``ext/forgekit_cudnn.cc`` into the library, linked
    against ``libcudnn.so.9`` and ``libcudart.so.13`` by soname: the runtime finds them where it runs
    (:func:`forgekit.runtime.device.ensure_cuda` loads them from NVIDIA's wheels), not where it was built."""
    import tvm_ffi
    from tvm.support import cc

    kit = find_cudnn()
    if kit is None:
        from ...errors import ToolchainError

        raise ToolchainError("Linking cuDNN calls needs NVIDIA's cuDNN 9 and CUDA runtime wheels: pip install "
                             "nvidia-cudnn-cu13 nvidia-cuda-runtime.")
    base = fcompile or cc.create_shared
    flags = [f"-I{Path(tvm_ffi.__file__).parent / 'include'}", f"-I{kit.include}", f"-I{kit.cudart_include}",
             "-std=c++17", "-O2", f"-L{kit.lib}", f"-L{kit.cudart_lib}"]
    # after the sources that use them (TVM puts options first, and Debian's g++ links --as-needed)
    libraries = [f"-l:{name}" for name in LIBRARIES]

    def compile_with_extension(output: str, objects: list[str], options: list[str] | None = None,
                               **kwargs: Any) -> Any:
        return base(output, [*objects, str(SOURCE), *libraries], options=[*(options or []), *flags], **kwargs)

    for attr in ("output_format", "get_target_triple", "object_format"):
        if hasattr(base, attr):
            setattr(compile_with_extension, attr, getattr(base, attr))
    return compile_with_extension
