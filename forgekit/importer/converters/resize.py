"""ONNX Resize with ONNX's coordinates, opset 18's ``axes`` and ``keep_aspect_ratio_policy``.

TVM 0.27's converter maps an output pixel to the input with the ratio ``in / out`` of the sizes.  ONNX
(and onnxruntime) use ``1 / scale``: the same when ``in * scale`` is an integer, different otherwise
(``scales = 0.6`` on 7 pixels: out 4, ONNX steps by 1.667, TVM by 1.75: other pixels are read, a silent
wrong answer).  Nearest resizes by a non-integer ratio also have ties (``x.5``) that LLVM's fast-math
(opt level 4) rounds the other way.  TVM's converter also ignores ``axes``.

So: integer up/down-sampling (what detectors and segmenters use; ``x2`` nearest) goes to TVM's fused
``resize2d`` as before, ``axes``/``keep_aspect_ratio_policy`` resolved into full sizes first.  Any other
nearest or linear resize with static spatial sizes is computed here exactly as onnxruntime does: the source
index (and for linear the weight) of every output row/column is computed at import, in float32 like
onnxruntime's kernel, and the resize becomes ``take`` along each axis (plus one lerp per axis for linear).
Found by ``forgekit.testing``: ``tests/assets/fuzz/resize_*.onnx``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from ._common import attr_str

F32 = np.float32
HALF = F32(0.5)


def _const(expr: Any, params: Any) -> np.ndarray | None:
    value = _fe.get_constant(expr, params) if expr is not None else None
    if isinstance(value, tvm.ir.GenericConst):
        array = value.value.numpy()
        return array if array.size else None
    return None


def source_coords(n_in: int, n_out: int, scale: float, mode: str) -> np.ndarray | None:
    """The input coordinate of each output index along one axis, in float32 like onnxruntime's
    ``GetOriginalCoordinateFromResizedCoordinate`` (so ties round the same way); None for a mode not computed
    here."""
    x, s = np.arange(n_out, dtype=F32), F32(scale)
    if mode == "half_pixel":
        return (x + HALF) / s - HALF
    if mode == "asymmetric":
        return x / s
    if mode == "pytorch_half_pixel":
        return (x + HALF) / s - HALF if n_out > 1 else np.zeros(n_out, F32)
    if mode == "tf_half_pixel_for_nn":
        return (x + HALF) / s
    if mode == "align_corners":
        return np.zeros(n_out, F32) if n_out == 1 else x * F32(n_in - 1) / F32(n_out - 1)
    if mode == "half_pixel_symmetric":  # onnxruntime 1.32 has it as half_pixel: ONNX's reference, in float64
        x64, s64 = np.arange(n_out, dtype="float64"), float(s)
        offset = n_in / 2 * (1 - n_out / (s64 * n_in))
        return offset + (x64 + 0.5) / s64 - 0.5
    return None


def nearest_index(coords: np.ndarray, n_in: int, rounding: str) -> np.ndarray:
    """onnxruntime's nearest modes (``std::round`` is half away from zero), clamped to the input."""
    if rounding == "floor":
        idx = np.floor(coords)
    elif rounding == "ceil":
        idx = np.ceil(coords)
    else:
        away = np.sign(coords) * np.floor(np.abs(coords) + HALF)  # std::round
        tie = coords == np.trunc(coords) + HALF
        idx = np.where(tie, np.floor(coords), away) if rounding == "round_prefer_floor" else away
    return np.clip(idx, 0, n_in - 1).astype("int64")


def linear_taps(coords: np.ndarray, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first index, second index, weight of the second) per output index, as onnxruntime's bilinear setup."""
    c = np.clip(coords, F32(0), F32(n_in - 1))
    lo = np.minimum(c.astype("int64"), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, (c - lo.astype(F32)).astype(F32)


def _plan(x: Any, inputs: list[Any], attr: dict, params: Any
          ) -> tuple[list[int | None], list[int | None], list[float]] | None:
    """(input dims, output dims, coordinate scale) per axis; None when sizes/scales are not constants."""
    dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in x.ty.shape.values]
    rank = len(dims)
    scales = _const(inputs[2], params) if len(inputs) > 2 else None
    sizes = _const(inputs[3], params) if len(inputs) > 3 else None
    axes = [int(a) % rank for a in attr.get("axes", range(rank))]
    out: list[int | None] = list(dims)
    scale = [1.0] * rank
    if scales is not None:
        for a, s in zip(axes, scales.astype(F32).tolist()):
            scale[a] = s
            out[a] = None if dims[a] is None else int(math.floor(dims[a] * s))
        return dims, out, scale
    if sizes is None:
        return None
    policy = attr_str(attr, "keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        if any(dims[a] is None for a in axes):
            return None
        ratios = [float(F32(n) / F32(dims[a])) for a, n in zip(axes, sizes.tolist())]
        common = min(ratios) if policy == "not_larger" else max(ratios)
        for a in axes:
            scale[a], out[a] = common, int(math.floor(common * dims[a] + 0.5))
        return dims, out, scale
    for a, n in zip(axes, sizes.tolist()):
        out[a] = int(n)
        scale[a] = 1.0 if dims[a] is None else float(F32(n) / F32(dims[a]))
    return dims, out, scale


def _spatial_sizes(x: Any, inputs: list[Any], attr: dict, sizes: Any) -> tuple[list[Any], dict, list | None]:
    """Sizes whose batch and channel entries are ``x``'s own (the only ones Resize can keep: it resizes
    spatial axes) as spatial-only sizes: constants with ``axes`` when they are static (the exact
    coordinate path below applies), else the symbolic spatial sizes to resize to."""
    values, dims = list(sizes.values), list(x.ty.shape.values)
    analyzer = tvm.sym.Analyzer()
    if len(values) != len(dims) or not all(analyzer.can_prove_equal(v, d) for v, d in zip(values[:2], dims[:2])):
        raise ValueError("Resize of the batch or channel axis to a size computed at run time is not supported")
    spatial = values[2:]
    if all(isinstance(v, tvm.tirx.IntImm) for v in spatial):
        const = relax.const(np.array([int(v) for v in spatial], dtype="int64"))
        return [*inputs[:3], const, *inputs[4:]], {**attr, "axes": list(range(2, len(dims)))}, None
    return inputs, attr, spatial


def _resize_to(bb: Any, x: Any, spatial: list[Any], attr: dict) -> Any:
    """A 2-D resize to symbolic spatial sizes, with the attributes TVM's converter maps."""
    if len(spatial) != 2:
        raise ValueError("Resize to a size computed at run time is supported for 4-D inputs only")
    mode = attr_str(attr, "mode", "nearest")
    return relax.op.image.resize2d(
        x, size=relax.ShapeExpr(spatial), roi=[0.0] * 4, layout="NCHW",
        method="nearest_neighbor" if mode == "nearest" else mode,
        coordinate_transformation_mode=attr_str(attr, "coordinate_transformation_mode", "half_pixel"),
        rounding_method=attr_str(attr, "nearest_mode", "round_prefer_floor"),
        cubic_alpha=attr.get("cubic_coeff_a", -0.75), cubic_exclude=attr.get("exclude_outside", 0),
        extrapolation_value=attr.get("extrapolation_value", 0.0))


class Resize(_fe.Resize):
    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        x = inputs[0]
        scales = _fe.get_constant(inputs[2], params) if len(inputs) > 2 and inputs[2] is not None else None
        if (isinstance(scales, tvm.ir.GenericConst) and scales.value.numpy().size == 0 and len(inputs) > 3
                and inputs[3] is not None):
            # an empty ``scales`` tensor next to ``sizes`` means "no scales" (paddle2onnx writes it so; the
            # spec also allows ""): TVM's converter asserts that only one of the two is given
            inputs = [*inputs[:2], None, *inputs[3:]]
        sizes = _fe.get_constant(inputs[3], params) if len(inputs) > 3 and inputs[3] is not None else None
        if isinstance(sizes, relax.ShapeExpr) and "axes" not in attr and not all(
                isinstance(v, tvm.tirx.IntImm) for v in sizes.values):
            # sizes computed from shapes with a symbolic batch or size (paddle2onnx's
            # Concat(Shape(x)[:2], Shape(y)[2:]); TVM's converter reads every entry as an int)
            inputs, attr, symbolic = _spatial_sizes(x, inputs, attr, sizes)
            if symbolic is not None:
                return _resize_to(bb, x, symbolic, attr)
        plan = _plan(x, inputs, attr, params)
        if plan is None:
            return super()._impl_v18(bb, inputs, attr, params)
        dims, out, scale = plan
        if len(inputs) > 2 and _const(inputs[2], params) is not None and "axes" not in attr and all(
                float(v).is_integer() and v >= 1 for v in scale) and any(
                d is None for d, v in zip(dims, scale) if v != 1.0):
            # integer upsampling of a symbolic size (a 2x FPN upsample on a dynamic image): TVM computes
            # the size as int64(2.0 * float(H)), which no later shape equals (the sum with the lateral
            # branch got an unknown shape); integer scales make it 2 * H, the same thing exactly
            int_scales = relax.ShapeExpr([int(v) for v in scale])
            return super()._impl_v18(bb, [x, inputs[1] if len(inputs) > 1 else None, int_scales], attr, params)
        mode = attr_str(attr, "mode", "nearest")
        coord = attr_str(attr, "coordinate_transformation_mode", "half_pixel")
        changed = [a for a in range(len(dims)) if out[a] != dims[a] or scale[a] != 1.0]
        regular = all(
            dims[a] is not None and out[a] is not None and out[a] > 0
            and (out[a] % dims[a] == 0 or dims[a] % out[a] == 0)
            and math.isclose(scale[a] * dims[a], out[a], rel_tol=0, abs_tol=1e-6) for a in changed)
        exact_ok = (mode in ("nearest", "linear") and coord != "tf_crop_and_resize" and all(a >= 2 for a in changed)
                    and all(dims[a] is not None for a in changed)
                    and (mode == "nearest" or "float" in str(x.ty.dtype)))
        if not regular and exact_ok:
            rounding = attr_str(attr, "nearest_mode", "round_prefer_floor")
            return cls._exact(bb, x, [(a, dims[a], out[a], scale[a]) for a in changed], mode, coord, rounding)
        if "axes" in attr or attr_str(attr, "keep_aspect_ratio_policy", "stretch") != "stretch":
            # TVM's converter reads full-rank scales, or sizes of which it uses the spatial ones only
            rest = {k: v for k, v in attr.items() if k not in ("axes", "keep_aspect_ratio_policy")}
            roi = inputs[1] if len(inputs) > 1 else None
            if all(out[a] is not None for a in range(2, len(out))):
                full = relax.const(np.array([1, 1] + out[2:], dtype="int64"))
                return super()._impl_v18(bb, [x, roi, None, full], rest, params)
            if len(inputs) > 2 and _const(inputs[2], params) is not None:
                full = relax.const(np.array(scale, dtype="float32"))
                return super()._impl_v18(bb, [x, roi, full], rest, params)
        return super()._impl_v18(bb, inputs, attr, params)

    @classmethod
    def _exact(cls, bb, x, axes: list[tuple[int, int, int, float]], mode: str, coord: str, rounding: str):
        y = x
        rank = len(x.ty.shape.values)
        for axis, n_in, n_out, scale in axes:
            coords = source_coords(n_in, n_out, scale, coord)
            if coords is None:
                raise ValueError(f"coordinate_transformation_mode '{coord}' is not supported")
            if mode == "nearest":
                y = bb.emit(relax.op.take(y, relax.const(nearest_index(coords, n_in, rounding)), axis=axis))
                continue
            lo, hi, weight = linear_taps(coords, n_in)
            first = bb.emit(relax.op.take(y, relax.const(lo), axis=axis))
            second = bb.emit(relax.op.take(y, relax.const(hi), axis=axis))
            w = relax.const(weight.reshape([n_out] + [1] * (rank - 1 - axis)).astype(str(x.ty.dtype)))
            y = bb.emit(relax.op.add(first, relax.op.multiply(relax.op.subtract(second, first), w)))
        return y


CONVERTERS = {"Resize": Resize}
