"""ONNX MaxPool/AveragePool (and Conv) with ``auto_pad`` SAME_UPPER/SAME_LOWER, padded as the ONNX spec says.

TVM 0.27's converter computes SAME pads by calling ``int()`` on every dimension (a symbolic batch or length
fails to import), ignores dilations for average pools, and sizes SAME_LOWER outputs with ``floor`` where
ONNX says ``ceil(in / stride)`` for both.  Here the pads are computed from the spatial dimensions only
(``total = max((ceil(in / s) - 1) * s + (k - 1) * d + 1 - in, 0)``; the odd one goes after for
SAME_UPPER, before for SAME_LOWER) and handed to TVM's converter as explicit ``pads``; with stride 1 the
total does not depend on ``in``, so symbolic lengths work too.  Found by ``forgekit.testing``:
``tests/assets/fuzz/*pool1d*``.

With a stride above 1 on a symbolic dimension the pads depend on ``in mod stride`` (tf2onnx's SAME MaxPool
with stride 2 on a dynamic H x W: TVM's ``int()`` of the dimension failed).  Then the input is padded by the
most any size needs (``span - 1`` in all) and the window is sliced back to ``in + total(in)`` elements
starting where this size's own begin pad starts (:func:`same_window`): the pooling (or convolution) then needs no pads, and
its output is cast to ONNX's ``ceil(in / stride)``, a shape later ops can match.  Average pools divide by
the same pooling of a ones tensor, so SAME's pads stay out of the count unless ``count_include_pad``.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from ._common import attr_str


def same_pads(dims: list[int | None], kernel: list[int], strides: list[int], dilations: list[int],
              mode: str) -> list[int] | None:
    """ONNX ``pads`` (all begins, then all ends) for SAME_UPPER/SAME_LOWER; None when a dimension that
    matters is symbolic."""
    begins, ends = [], []
    for n, k, s, d in zip(dims, kernel, strides, dilations):
        span = (k - 1) * d + 1
        if n is None and s != 1:
            return None
        total = max(span - 1, 0) if n is None else max((-(-n // s) - 1) * s + span - n, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else large)
        ends.append(large if mode == "SAME_UPPER" else small)
    return begins + ends


def _with_explicit_pads(cls: type) -> type:
    class Converter(cls):  # type: ignore[misc, valid-type]
        @classmethod
        def _impl_v1(cls_, bb, inputs, attr, params):
            mode = attr_str(attr, "auto_pad", "NOTSET")
            if mode in ("SAME_UPPER", "SAME_LOWER"):
                shape = inputs[0].ty.shape.values
                rank = len(shape) - 2
                dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in shape[2:]]
                pads = same_pads(dims, list(attr["kernel_shape"]), list(attr.get("strides", [1] * rank)),
                                 list(attr.get("dilations", [1] * rank)), mode)
                if pads is not None:
                    attr = {**attr, "auto_pad": b"NOTSET", "pads": pads}
                else:
                    return _symbolic_same(bb, super()._impl_v1, inputs[0], attr, mode, params)
            return super()._impl_v1(bb, inputs, attr, params)

    Converter.__name__ = cls.__name__
    return Converter


def same_window(bb, data, kernel: list[int], strides: list[int], dilations: list[int], mode: str, value: float):
    """``data`` padded by the most any size needs and sliced to the window this size's SAME pads give, with
    ONNX's output extents ``ceil(in / stride)`` (see the module docstring)."""
    dims = list(data.ty.shape.values)
    widest, axes, begin, end, out = [], [], [], [], []
    for axis, (n, k, s, d) in enumerate(zip(dims[2:], kernel, strides, dilations)):
        span = (k - 1) * d + 1
        most = max(span - 1, 0)
        first, last = (most // 2, most - most // 2) if mode == "SAME_UPPER" else (most - most // 2, most // 2)
        widest += [first, last]
        # total(n) = max((ceil(n / s) - 1) * s + span - n, 0) = max(span - ((n - 1) mod s + 1), 0)
        total = tirx.max(span - (tirx.floormod(n - 1, s) + 1), 0)
        own_first = tirx.floordiv(total, 2) if mode == "SAME_UPPER" else total - tirx.floordiv(total, 2)
        axes.append(axis + 2)
        begin.append(first - own_first)
        end.append(first - own_first + n + total)
        out.append(tvm.sym.Analyzer().simplify(tirx.floordiv(n + s - 1, s)))
    padded = bb.emit(relax.op.nn.pad(data, [0, 0, 0, 0] + widest, pad_value=value))
    return bb.emit(relax.op.strided_slice(padded, axes, begin, end, assume_inbound=True)), out


def _symbolic_same(bb, pool, data, attr, mode: str, params):
    """SAME pooling where a symbolic dimension has a stride above 1: pool the window without pads."""
    dims = list(data.ty.shape.values)
    rank = len(dims) - 2
    window = [list(attr["kernel_shape"]), list(attr.get("strides", [1] * rank)), list(attr.get("dilations", [1] * rank))]
    plain = {**attr, "auto_pad": b"NOTSET", "pads": [0] * (2 * rank)}
    if pool.__self__.name != "avg_pool":
        sliced, out = same_window(bb, data, *window, mode, float("-inf"))
        pooled = bb.emit(pool(bb, [sliced], plain, params))
    else:
        sliced, out = same_window(bb, data, *window, mode, 0.0)
        pooled = bb.emit(pool(bb, [sliced], {**plain, "count_include_pad": 1}, params))
        if not attr.get("count_include_pad", 0):  # divide by the share of each window inside the input
            ones, _ = same_window(bb, bb.emit(relax.op.ones_like(data)), *window, mode, 0.0)
            share = bb.emit(pool(bb, [ones], {**plain, "count_include_pad": 1}, params))
            pooled = bb.emit(relax.op.divide(pooled, share))
    return bb.match_cast(pooled, relax.TensorType([*dims[:2], *out], data.ty.dtype))


class Conv(_fe.Conv):
    """SAME convolutions (tf2onnx writes them for every Conv of a model with a dynamic H x W) padded as
    pools are: explicit pads when they do not depend on a symbolic size, else :func:`same_window`; TVM's
    ``autopad`` fails on symbolic sizes ("Cannot use and / or / not operator to Expr")."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        mode = attr_str(attr, "auto_pad", "NOTSET")
        data = inputs[0]
        if mode not in ("SAME_UPPER", "SAME_LOWER") or not isinstance(data.ty.shape, relax.ShapeExpr):
            return super()._impl_v11(bb, inputs, attr, params)
        shape = data.ty.shape.values
        rank = len(shape) - 2
        kernel = [int(k) for k in attr.get("kernel_shape", inputs[1].ty.shape.values[2:])]
        strides, dilations = list(attr.get("strides", [1] * rank)), list(attr.get("dilations", [1] * rank))
        dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in shape[2:]]
        pads = same_pads(dims, kernel, strides, dilations, mode)
        if pads is not None:
            return super()._impl_v11(bb, inputs, {**attr, "auto_pad": b"NOTSET", "pads": pads}, params)
        sliced, out = same_window(bb, data, kernel, strides, dilations, mode, 0.0)
        conv = bb.emit(super()._impl_v11(bb, _fe.onnx_input([sliced, *list(inputs)[1:]]), {**attr, "auto_pad": b"NOTSET",
                                                                     "kernel_shape": kernel, "pads": [0] * (2 * rank)},
                                         params))
        return bb.match_cast(conv, relax.TensorType([*conv.ty.shape.values[:2], *out], data.ty.dtype))


CONVERTERS = {"Conv": Conv, "MaxPool": _with_explicit_pads(_fe.MaxPool), "AveragePool": _with_explicit_pads(_fe.AveragePool)}
