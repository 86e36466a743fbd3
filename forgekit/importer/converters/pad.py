"""ONNX Pad in constant mode as ``relax.nn.pad``.

TVM's converter emits a constant Pad as a TE function (``call_tir(pad)``), which no Relax pass can see
into: ConvertLayout moved an NHWC tensor back to NCHW around it (``permute_dims -> pad -> permute_dims``),
so each explicit Pad between two convolutions (tf2onnx writes SAME padding that way; onnxruntime's
``quantize_dynamic`` too) cost two transposes and kept the pad in NCHW.  ``relax.nn.pad`` legalizes to the
same ``topi.nn.pad``, and :mod:`forgekit.passes.quantize_layout` moves it past the transposes.

Negative pads (ONNX's crop) and the other modes keep TVM's conversion.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe


def _nn_pad(bb, data, before, after, value):
    """``relax.nn.pad`` for non-negative widths, else None."""
    widths = [int(v) for pair in zip(before, after) for v in pair]
    if any(w < 0 for w in widths):
        return None
    return bb.normalize(relax.op.nn.pad(data, widths, pad_value=float(value)))


class Pad(_fe.Pad):
    @classmethod
    def _impl_v2(cls, bb, inputs, attr, params):
        pads = attr.get("pads")
        if attr.get("mode", b"constant").decode("utf-8") == "constant" and pads is not None:
            half = len(pads) // 2
            out = _nn_pad(bb, inputs[0], pads[:half], pads[half:], attr.get("value", 0.0))
            if out is not None:
                return out
        return super()._impl_v2(bb, inputs, attr, params)

    @classmethod
    def _lower_pad(cls, bb, inputs, attr, params, allowed_modes):
        if attr.get("mode", b"constant").decode("utf-8") == "constant":
            before, after, value = cls._parse_pads_and_axes(inputs, params)
            out = _nn_pad(bb, inputs[0], before, after, value)
            if out is not None:
                return out
        return super()._lower_pad(bb, inputs, attr, params, allowed_modes)


CONVERTERS = {"Pad": Pad}
