"""Post-training quantization: calibration, the int8 rewrite, accuracy reports, tensor splitting.

``IRModule.calibrate`` / ``quantize`` / ``split_tensors`` delegate here (the functions take a Relax
``tvm.IRModule`` and plain data, never the façade)::

    ir = forgekit.from_onnx("resnet18.onnx")
    ir.calibrate(samples)                       # arrays, tuples, dicts or a .npy/.npz/folder path
    ir.quantize(per_channel=True, calib_method="entropy")
    ir.compile(target="host", output_path="out")  # int8 conv/matmul with int32 accumulation

Activations are quantized with one scale per tensor (symmetric int8, or uint8 for tensors that are never
negative), weights symmetric int8 per tensor or per output channel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import UsageError
from ..options import CALIB_METHODS, QUANT_TYPES, QuantizeOptions
from . import graph
from .calibrate import Calibration, calibrate
from .ranges import threshold
from .rewrite import OpPlan, rewrite
from .slices import split_to_slices

if TYPE_CHECKING:
    import tvm


def plan(mod: tvm.IRModule, calib: Calibration | None, *, activation_dtype: str = "int8", per_channel: bool = False,
         calib_method: str = "average", quant_type: str = "any", percentile: float = 99.0,
         keep_fp32: set[int] | frozenset[int] = frozenset(), smoothing: float | None = 0.75,
         smooth_convs: bool = True, bias_correction: bool = True) -> tuple[dict[int, OpPlan], str]:
    """Per-op quantization plans and the effective quant type (``static`` or ``dynamic``).

    ``bias_correction`` (static only) removes the expected output error of weight rounding using the
    calibrated per-channel input means (see :func:`rewrite.weight_error_bias`)."""
    QuantizeOptions(activation_dtype=activation_dtype, quant_type=quant_type, calib_method=calib_method)  # validates
    if quant_type == "static" and calib is None:
        raise UsageError("Static quantization needs calibration data: call ir.calibrate(samples) first "
                         "(CLI: --calib-data PATH), or use quant_type='dynamic'.")
    effective = "static" if quant_type == "static" or (quant_type == "any" and calib is not None) else "dynamic"
    ops = graph.describe(mod["main"])
    calls = [call for _b, call in graph.quantizable(mod["main"])]
    weights = [call.args[1].value.numpy() for call in calls]
    groups = [int(call.attrs.groups) if graph.is_conv(call) else 1 for call in calls]
    convs = {i for i, call in enumerate(calls) if graph.is_conv(call)}
    plans: dict[int, OpPlan] = {}
    for op in ops:
        if op.index in keep_fp32:
            continue
        if effective == "dynamic":
            plans[op.index] = OpPlan(None, "int8", per_channel)
            continue
        stats = calib.stats[op.index]  # type: ignore[union-attr]
        factors, channel_range = None, None
        if smoothing and op.op == "matmul":
            channel_range = stats.channel_range
            factors = _smoothing(stats.channel_absmax, np.abs(weights[op.index]).max(axis=1), smoothing)
        elif smoothing and smooth_convs and op.index in convs and _smoothable_conv(weights[op.index], groups[op.index]):
            channel_range = stats.axis1_range
            w = np.abs(weights[op.index])
            kernel = tuple(range(2, w.ndim))  # the kernel's spatial axes: (2, 3) of OIHW, (2,) of OIW
            # input channel c meets W[:, c] (regular conv) or W[c] (depthwise)
            # convolutions take a milder alpha: measured on PP-OCRv4 det/rec, 0.5 beats 0.75
            factors = _smoothing(stats.axis1_absmax, w.max(axis=(0, *kernel)) if groups[op.index] == 1
                                 else w.max(axis=(1, *kernel)), min(smoothing, 0.5))
        if factors is not None:
            # the smoothed tensor has no outlier channels left to clip: its range is its extremes
            lo = float(np.min(channel_range[0] / factors))  # type: ignore[index]
            hi = float(np.max(channel_range[1] / factors))  # type: ignore[index]
        else:
            t = threshold(calib_method, stats, 255 if activation_dtype == "uint8" and stats.non_negative else 127,
                          {"percentile": percentile})
            lo, hi = max(stats.min, -t), min(stats.max, t)
        plans[op.index] = _activation_plan(min(lo, 0.0), max(hi, 0.0), activation_dtype, per_channel, factors)
        if bias_correction:
            mean = stats.axis1_mean if op.index in convs else stats.channel_mean
            w = weights[op.index]
            channels = w.shape[1] * groups[op.index] if op.index in convs else w.shape[0]
            if mean is not None and mean.shape == (channels,):
                plans[op.index].input_mean = mean
    return plans, effective


def _activation_plan(lo: float, hi: float, activation_dtype: str, per_channel: bool,
                     factors: np.ndarray | None) -> OpPlan:
    """The activation quantization of the range ``[lo, hi]`` (``lo <= 0 <= hi``).

    ``int8`` is symmetric.  ``uint8`` is asymmetric, ``x = scale * (q - zero_point)``, so a tensor that is
    mostly non-negative (after SiLU/hardswish/GELU: min -0.28/-0.375/-0.17) gets all 256 levels rather than
    the 127 positive ones of symmetric int8.  A conv that pads its input reads ``zero_point`` at the border
    (the rewrite pads explicitly), so padded convs take a zero point too.
    """
    if activation_dtype == "uint8":
        scale = max(hi - lo, 1e-8) / 255
        return OpPlan(scale, "uint8", per_channel, factors, int(np.clip(np.round(-lo / scale), 0, 255)))
    return OpPlan(max(-lo, hi, 1e-8) / 127, "int8", per_channel, factors)


def depthwise_ops(func: Any) -> set[int]:
    """Indices (as in :func:`graph.describe`) of the depthwise convolutions of ``func``."""
    return {i for i, (_b, call) in enumerate(graph.quantizable(func))
            if graph.is_conv(call) and int(call.attrs.groups) > 1
            and int(call.attrs.groups) == int(call.args[1].ty.shape.values[0])
            and int(call.args[1].ty.shape.values[1]) == 1}


#: convs/matmuls with fewer output channels than this stay fp32 (see :func:`narrow_ops`)
MIN_INT8_OUT_CHANNELS = 8


def narrow_ops(func: Any) -> set[int]:
    """Indices of the quantizable ops with fewer than :data:`MIN_INT8_OUT_CHANNELS` output channels.

    The dot-product kernels pad the output channels to a full vector (16 int32 lanes on VNNI), so a conv
    with one output channel computes 16x what it needs for no speed-up.  The case that matters is a YOLOv8
    DFL (softmax over 16 bins, then a fixed 16->1 1x1 conv giving the expected bin): int8 rounds the
    probabilities to 1/127 steps before the expectation.  Measured on bench/models/yolo_style.onnx (320,
    4 held-out inputs vs onnxruntime fp32): box error max 0.80 px / mean 0.088 px with the DFL conv in
    int8, 0.015 px / 0.0006 px with it in fp32; latency the same (5.01 vs 5.03 ms, 2 threads).
    """
    out = set()
    for i, (_b, call) in enumerate(graph.quantizable(func)):
        shape = [int(v) for v in call.args[1].ty.shape.values]
        channels = shape[0] if graph.is_conv(call) else shape[-1]
        if channels < MIN_INT8_OUT_CHANNELS:
            out.add(i)
    return out


def policy_fp32(func: Any, quantize_depthwise: bool = False) -> set[int]:
    """The ops forgekit keeps in fp32 whatever the user asks: narrow ones (:func:`narrow_ops`), and depthwise
    convolutions unless ``quantize_depthwise`` (see :func:`quantize`).  One place, so that the accuracy
    budget measures the model :func:`quantize` then builds."""
    return narrow_ops(func) | (set() if quantize_depthwise else depthwise_ops(func))


def _smoothable_conv(w: np.ndarray, groups: int) -> bool:
    """Regular or depthwise (one filter per channel) convolutions: per-input-channel factors fold into W."""
    return groups == 1 or (w.shape[1] == 1 and groups == w.shape[0])


def _smoothing(channel_max: np.ndarray | None, wmax: np.ndarray, alpha: float) -> np.ndarray | None:
    """SmoothQuant's per-input-channel factors ``s_k = max|x_k|^a / max|W_k|^(1-a)`` for ``x @ W`` (and
    for convolutions, whose input channels are the reduction channels just the same).

    Transformer activations carry a few channels 10-100x larger than the rest; a per-tensor int8 scale
    either clips them or rounds every other channel to a handful of levels.  Dividing those channels by
    ``s`` (and multiplying the matching weight rows) moves the difficulty into the per-channel weights.
    """
    if channel_max is None or channel_max.shape[0] != wmax.shape[0]:
        return None
    a = channel_max.astype(np.float64)
    wmax = wmax.astype(np.float64)
    s = np.where((a > 0) & (wmax > 0), np.power(np.maximum(a, 1e-8), alpha) / np.power(np.maximum(wmax, 1e-8), 1 - alpha), 1.0)
    return np.clip(s, 1e-4, 1e4).astype(np.float32)


def quantize(mod: tvm.IRModule, calib: Calibration | None, *, activation_dtype: str = "int8", kernel_dtype: str | None = None,
             bias_dtype: str | None = None, per_channel: bool = False, calib_method: str = "average",
             quant_type: str = "any", percentile: float = 99.0, smoothing: float | None = 0.75,
             keep_fp32: set[int] | frozenset[int] = frozenset(),
             quantize_depthwise: bool = False, bias_correction: bool = True) -> tuple[Any, dict[str, Any]]:
    """The quantized Relax module of ``mod`` and the quantization parameters (for the metadata).

    Depthwise convolutions stay fp32 unless ``quantize_depthwise``: they have a handful of multiply-adds
    per value, so int8 buys no compute (the integer depthwise kernel is the exact fp32 one) and costs a
    requantize/dequantize around each; measured on MobileNetV2 (2 threads): 3.09 ms with int8 depthwise,
    2.24 ms with fp32 depthwise, same output cosine; on PP-OCRv4 rec it is also the most lossy layer kind.
    Ops with fewer than :data:`MIN_INT8_OUT_CHANNELS` output channels stay fp32 too (:func:`narrow_ops`).
    """
    QuantizeOptions(kernel_dtype=kernel_dtype, bias_dtype=bias_dtype)  # validates
    if calib is not None and len(calib.ops) != len(graph.describe(mod["main"])):
        raise UsageError("The calibration no longer matches the model (it changed since ir.calibrate): "
                         "calibrate again with reset=True.")
    keep_fp32 = set(keep_fp32) | policy_fp32(mod["main"], quantize_depthwise)
    plans, effective = plan(mod, calib, activation_dtype=activation_dtype, per_channel=per_channel,
                            calib_method=calib_method, quant_type=quant_type, percentile=percentile,
                            keep_fp32=keep_fp32, smoothing=smoothing, bias_correction=bias_correction)
    ops = graph.describe(mod["main"])
    info = {
        "activation_dtype": activation_dtype,
        "kernel_dtype": "int8",
        "bias_dtype": "float32",  # the bias is added in the fp32 epilogue after dequantization
        "accumulator_dtype": "int32",
        "per_channel": bool(per_channel),
        "calib_method": calib_method if effective == "static" else None,
        "quant_type": effective,
        "calibration_samples": calib.samples if calib is not None else 0,
        "quantized_ops": len(plans),
        "smoothing": smoothing if any(p.smooth is not None for p in plans.values()) else None,
        "bias_correction": any(p.input_mean is not None for p in plans.values()),
        "fp32_ops": [ops[i].name for i in sorted(keep_fp32) if i < len(ops)],
        "quantize_depthwise": bool(quantize_depthwise),
        "layers": [{"name": op.name, "op": op.op, "activation_dtype": plans[op.index].x_dtype,
                    "activation_scale": plans[op.index].x_scale, "activation_zero_point": plans[op.index].zero_point}
                   for op in ops if op.index in plans],
    }
    if calib_method == "percentile" and effective == "static":
        info["percentile"] = percentile
    # after the rewrite every split part feeds a requantize (or a concat that does): slices fuse into them
    return split_to_slices(rewrite(mod, plans)), info


__all__ = ["CALIB_METHODS", "QUANT_TYPES", "Calibration", "calibrate", "depthwise_ops", "narrow_ops", "plan",
           "policy_fp32", "quantize", "rewrite"]
