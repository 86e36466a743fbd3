"""ONNX MaxPool/AveragePool with ``auto_pad`` SAME_UPPER/SAME_LOWER, padded as the ONNX spec says.

TVM 0.27's converter computes SAME pads by calling ``int()`` on every dimension (a symbolic batch or length
fails to import), ignores dilations for average pools, and sizes SAME_LOWER outputs with ``floor`` where
ONNX says ``ceil(in / stride)`` for both.  Here the pads are computed from the spatial dimensions only
(``total = max((ceil(in / s) - 1) * s + (k - 1) * d + 1 - in, 0)``; the odd one goes after for
SAME_UPPER, before for SAME_LOWER) and handed to TVM's converter as explicit ``pads``; with stride 1 the
total does not depend on ``in``, so symbolic lengths work too.  Found by ``forgekit.testing``:
``tests/assets/fuzz/*pool1d*``.
"""

from __future__ import annotations

import tvm
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
            return super()._impl_v1(bb, inputs, attr, params)

    Converter.__name__ = cls.__name__
    return Converter


CONVERTERS = {"MaxPool": _with_explicit_pads(_fe.MaxPool), "AveragePool": _with_explicit_pads(_fe.AveragePool)}
