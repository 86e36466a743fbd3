"""Convolutions through NVIDIA's cuDNN on CUDA targets (phase 1 of :mod:`.pipeline`, "library dispatch").

Every 2-D convolution cuDNN computes exactly as the graph does becomes one call into
``ext/forgekit_cudnn.cc``, which :func:`with_extension` compiles into the artifact's library::

    conv2d(x, w) [-> astype(x.dtype): the fp16 build's fp32 accumulator, rounded once]
      =>  R.call_dps_packed("forgekit_cudnn_conv2d", (x, w, attrs), out)

Its epilogue (bias, residual add, ReLU, ReLU6, HardSwish...) stays Relax, so TVM fuses it into one elementwise
kernel.  Measured on an H200 (ResNet-50, batch 32): cuDNN's own fused conv+bias+ReLU
(``cudnnConvolutionBiasActivationForward``) ran its convolutions on ``implicit_convolve_sgemm``, a kernel without
tensor cores, 46-66 % of the model's time; the plain convolution gets the fastest kernel cudnnFind measures.

The class it covers: NCHW/OIHW and NHWC (forgekit's ``--layout last``: HWIO weights, turned into cuDNN's
OHWI here) in fp32 and fp16; any groups (depthwise included), strides, dilations and symmetric padding;
symbolic batch and spatial sizes (cuDNN plans each shape it meets at run time); asymmetric padding (an
explicit pad of the excess first) and few input channels (zero channels appended: :func:`_aligned_channels`).
fp32 stays exact (FMA kernels only, no TF32); fp16 uses tensor cores.  Other layouts and fp16 convolutions
whose fp32 result feeds a fp32 consumer keep TVM's kernels.

Why: on an H200, DLight's implicit-GEMM convolutions ran ResNet-50 at batch 32 in 18.6 ms (fp32) and
MobileNetV2 in 68 ms (depthwise), where PyTorch (cuDNN) took 11.3 and 2.9 ms (``../shared/notes/gpu.md``).
Why not TVM's ``partition_for_cudnn``: its codegen (``relax.ext.cudnn``) and runtime are not in the apache-tvm
wheel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .dispatch import (
    cast_patterns,
    dtype_of,
    extension_compiler,
    find_cudart,
    rewrite_patterns,
    shape_of,
    static_ints,
)

#: the packed function's symbol in the artifact (``__tvm_ffi_`` + this)
FUNCTION = "forgekit_cudnn_conv2d"
SOURCE = Path(__file__).parent / "ext" / "forgekit_cudnn.cc"
#: shared libraries the extension needs at run time (NVIDIA's nvidia-cudnn-cu13 and nvidia-cuda-runtime wheels)
LIBRARIES = ("libcudnn.so.9", "libcudart.so.13")
_FLOATS = ("float32", "float16")  # bf16 is a CPU precision in forgekit


def _weight(w: Any, layout: str) -> Any | None:
    """The weight as cuDNN reads it (OIHW for NCHW, OHWI for NHWC); an HWIO constant is transposed here."""
    import tvm
    from tvm import relax

    if layout in ("OIHW", "OHWI"):
        return w
    if layout == "HWIO" and isinstance(w, tvm.ir.expr.Constant):
        return relax.const(np.ascontiguousarray(w.value.numpy().transpose(3, 0, 1, 2)))
    return None


#: input channels cuDNN's fast kernels want a multiple of (fp16 tensor cores: 8 halves = 16 bytes; fp32's 4
#: made no measured difference: ResNet-50 b32 fp32 11.19 ms before and after)
CHANNEL_ALIGN = {"float16": 8, "float32": 4}


def _aligned_channels(x: Any, w: Any, nhwc: bool, groups: int, dtype: str) -> tuple[Any, Any]:
    """A convolution over few input channels (an RGB stem's 3) with zero channels appended to its input and
    weight, up to :data:`CHANNEL_ALIGN`: the same sums.  On an H200, ResNet-50's 3-channel 7x7 stem ran on
    ``implicit_convolve_sgemm`` (no tensor cores, no vector loads): 41 % of fp32 and 43 % of fp16 time at batch
    32, 2.4 ms per inference in fp16; MobileNetV2's 3-channel stem 37-45 %.  With 8 channels, fp16 ResNet-50 at
    batch 32 went from 6.70 to 6.16 ms (two runs), MobileNetV2 from 3.33 to 3.01."""
    import tvm
    from tvm import relax

    channels = static_ints([(shape_of(x) or [0] * 4)[3 if nhwc else 1]])
    align = CHANNEL_ALIGN.get(dtype, 1)
    if groups != 1 or channels is None or channels[0] % align == 0 or not isinstance(w, tvm.ir.expr.Constant):
        return x, w
    extra = align - channels[0] % align
    axis = 3 if nhwc else 1
    widths = [0] * 8
    widths[2 * axis + 1] = extra
    weights = w.value.numpy()
    pad = [(0, 0)] * 4
    pad[axis] = (0, extra)
    return relax.op.nn.pad(x, widths), relax.const(np.pad(weights, pad))


def _symmetric_padding(x: Any, pads: list[int], nhwc: bool) -> tuple[Any, list[int]]:
    """cuDNN pads both sides of an axis alike: the excess of an asymmetric padding (TensorFlow's SAME at stride
    2, forgekit's ConvTranspose phase convs: ``[1, 0, 1, 1]``) is an explicit zero pad of the input first."""
    from tvm import relax

    top, left, bottom, right = pads
    sym_h, sym_w = min(top, bottom), min(left, right)
    if (top, left) == (bottom, right):
        return x, pads
    h, w = (1, 2) if nhwc else (2, 3)
    widths = [0] * 8
    widths[2 * h], widths[2 * h + 1], widths[2 * w], widths[2 * w + 1] = \
        top - sym_h, bottom - sym_h, left - sym_w, right - sym_w
    return relax.op.nn.pad(x, widths), [sym_h, sym_w, sym_h, sym_w]


def _rewriter(parts: dict[str, Any], tensor_ops: bool, single_use: Callable[[Any], bool]) -> Callable[[Any, Any], Any]:
    from tvm import relax

    def rewrite(expr: Any, matched: Any) -> Any:
        conv = matched[parts["op"]]
        if "cast" in parts and not single_use(conv):
            return expr
        attrs, x = conv.attrs, matched[parts["x"]]
        dtype, out_dtype = dtype_of(x), dtype_of(expr)
        nhwc = attrs.data_layout == "NHWC"
        pads, strides, dilation = (static_ints(v) for v in (attrs.padding, attrs.strides, attrs.dilation))
        shape = shape_of(expr)
        if (dtype not in _FLOATS or dtype_of(matched[parts["w"]]) != dtype or out_dtype != dtype
                or attrs.data_layout not in ("NCHW", "NHWC") or attrs.out_layout not in ("", attrs.data_layout)
                or (nhwc and attrs.kernel_layout == "OIHW") or (not nhwc and attrs.kernel_layout != "OIHW")
                or None in (pads, strides, dilation, shape, shape_of(x)) or len(shape) != 4):
            return expr
        w = _weight(matched[parts["w"]], str(attrs.kernel_layout))
        if w is None:
            return expr
        x, pads = _symmetric_padding(x, pads, nhwc)
        x, w = _aligned_channels(x, w, nhwc, int(attrs.groups), dtype)
        flags = [int(nhwc), pads[0], pads[1], *strides, *dilation, int(attrs.groups), int(tensor_ops or dtype != "float32")]
        return relax.call_dps_packed(FUNCTION, relax.Tuple([x, w, relax.ShapeExpr(flags)]), out_ty=expr.ty)

    return rewrite


def route_convolutions(mod: Any, tensor_ops: bool) -> Any:
    """``mod`` with every convolution chain cuDNN computes exactly as one call (see the module docstring);
    ``tensor_ops``: whether fp32 may use TF32 tensor cores (fp16 always uses them)."""
    return rewrite_patterns(mod, cast_patterns("relax.nn.conv2d", ("x", "w")),
                            lambda parts, single_use: _rewriter(parts, tensor_ops, single_use))


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


def find_cudnn() -> CudnnKit | None:
    """cuDNN's ``cudnn.h`` and ``libcudnn.so.9`` and the CUDA runtime's headers and ``libcudart.so.13``, from
    NVIDIA's wheels (``nvidia-cudnn-cu13``, ``nvidia-cuda-runtime``) or ``/usr``; None when any is missing."""
    from ...runtime.device import nvidia_roots

    cudnn = [(r / "cudnn" / "include", r / "cudnn" / "lib") for r in nvidia_roots()]
    system = (Path("/usr/include"), Path("/usr/lib/x86_64-linux-gnu"))
    kit = next(((i, lib) for i, lib in [*cudnn, system] if (i / "cudnn.h").is_file()
                and (lib / "libcudnn.so.9").exists()), None)
    rt = find_cudart()
    return CudnnKit(kit[0], kit[1], rt[0], rt[1]) if kit and rt else None


def with_extension(fcompile: Any) -> Any:
    """``fcompile`` (None: TVM's default g++) also compiling ``ext/forgekit_cudnn.cc`` into the library, linked
    against ``libcudnn.so.9`` and ``libcudart.so.13`` by soname (:func:`.dispatch.extension_compiler`)."""
    kit = find_cudnn()
    if kit is None:
        from ...errors import ToolchainError

        raise ToolchainError("Linking cuDNN calls needs NVIDIA's cuDNN 9 and CUDA runtime wheels: pip install "
                             "nvidia-cudnn-cu13 nvidia-cuda-runtime.")
    flags = [f"-I{kit.include}", f"-I{kit.cudart_include}", f"-L{kit.lib}", f"-L{kit.cudart_lib}"]
    return extension_compiler(fcompile, SOURCE, flags, LIBRARIES)
