"""``conv(x - zx, w - zw)`` in int32 straight on the 8-bit operands: the form the VNNI / sdot kernels take.

Covers every 8-bit ``ConvInteger`` / ``QLinearConv`` with constant weights and a scalar input zero point, as
onnxruntime's quantizers write them:

* ``quantize_static`` (QOperator): constant ``zx``, int8 weights with ``zw = 0``;
* ``quantize_dynamic`` on CNNs: ``zx`` computed at run time by ``DynamicQuantizeLinear``, and (the default
  before onnxruntime 1.11, e.g. ddddocr's CAPTCHA recognizer) uint8 weights with any ``zw`` per tensor or per
  output channel.

The identity, exact in int32 (``x_p``: ``x`` padded with ``zx``; ``w' = w - 128``, ``zw' = zw - 128`` for uint8
weights, whose ``w - zw`` in [-255, 255] fits no 8-bit type)::

    conv(x_p - zx, w' - zw') = conv(x_p, w') - zx * sum(w'[m]) - zw'[m] * box(x_p - zx)

``box`` sums ``x_p - zx`` over a window and the channels of its group: an 8-bit conv with a kernel of ones and
one output channel per group, ~G/M of the conv's work.  A run-time ``zx`` cannot be a pad value: the conv
then pads with zeros and ``zx``'s share is taken over the taps inside the image only, from one-channel float
convs over a mask of ones (padding ``x`` with ``zx`` was an unvectorized NCHW pass of its own: 0.3 ms per conv
of ddddocr's recognizer, as long as the conv).  Before this module such convs ran whole in int32 on TVM's stock
kernel (that recognizer: 1.42-1.48x onnxruntime).

Why not TVM's QNN canonicalization: Relax has none (it was Relay's), and onnxruntime's own
``MlasConvSymmetric``/``MlasGemm`` u8u8 kernels are not callable from a TVM module.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ...passes.padding import pad_widths
from ._common import const_value, dtype_of, ndim_of

_CONV = {1: relax.op.nn.conv1d, 2: relax.op.nn.conv2d, 3: relax.op.nn.conv3d}
_LAYOUTS = {1: ("NCW", "OIW"), 2: ("NCHW", "OIHW"), 3: ("NCDHW", "OIDHW")}


def _i32(x):
    return relax.op.astype(x, "int32")


def _scalar_zero_point(bb, x_zp):
    """``(constant int or None, int32 scalar expression)`` of a scalar input zero point, or None if not scalar."""
    if x_zp is None:
        return 0, None
    value = const_value(x_zp)
    if value is not None:
        return (int(value.reshape(-1)[0]), None) if value.size == 1 else None
    if ndim_of(x_zp) > 0:
        try:
            count = int(np.prod([int(d) for d in x_zp.ty.shape.values]))
        except (TypeError, AttributeError):  # a symbolic extent: a zero point per row or element
            return None
        return (None, bb.normalize(relax.op.reshape(_i32(x_zp), []))) if count == 1 else None
    return None, bb.normalize(_i32(x_zp))


def _valid_tap_sums(bb, x, kernel: np.ndarray, pads: list[int], common: dict):
    """``conv(mask, kernel)`` in int32, ``mask`` ones over ``x``'s (symbolic) image padded with zeros: per output
    pixel, the sum of ``kernel`` over the taps inside the image (all of them away from the border)."""
    nsp = kernel.ndim - 2
    mask = relax.op.ones(relax.ShapeExpr([1, 1, *x.ty.shape.values[2:]]), "float32")
    conv = _CONV[nsp](mask, relax.const(kernel.astype(np.float32)), padding=pads,
                      **{**common, "out_dtype": "float32"})  # exact: integers below 2**24
    return bb.normalize(relax.op.astype(conv, "int32"))


def fast_int_conv(bb, x, w, x_zp, w_zp, attr):
    """The int32 ``conv(x - x_zp, w - w_zp)`` on 8-bit operands (see the module), or None where it does not
    apply (run-time weights, a zero point per input element, SAME padding, not 1-3 spatial dims)."""
    wv = const_value(w)
    wzv = const_value(w_zp) if w_zp is not None else np.zeros((), np.int32)
    if wv is None or wzv is None or str(wv.dtype) not in ("uint8", "int8"):
        return None
    if dtype_of(x) not in ("uint8", "int8") or (x_zp is not None and dtype_of(x_zp) != dtype_of(x)):
        return None
    if wzv.ndim > 1 or wzv.size not in (1, wv.shape[0]):
        return None
    zero_point = _scalar_zero_point(bb, x_zp)
    auto_pad = attr.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    nsp = ndim_of(x) - 2
    if zero_point is None or auto_pad not in ("NOTSET", "VALID") or nsp not in _CONV:
        return None
    zx, zx_expr = zero_point
    zw = wzv.astype(np.int32).reshape(-1)
    if str(wv.dtype) == "uint8":
        wv, zw = (wv.astype(np.int16) - 128).astype(np.int8), zw - 128
    pads = [0] * (2 * nsp) if auto_pad == "VALID" else list(attr.get("pads", [0] * (2 * nsp)))
    groups = int(attr.get("group", 1))
    common = dict(strides=attr.get("strides", 1), dilation=attr.get("dilations", 1),
                  data_layout=_LAYOUTS[nsp][0], kernel_layout=_LAYOUTS[nsp][1], out_dtype="int32")
    spatial = [1] * nsp
    zw_view = relax.const(zw.reshape([1, -1] + spatial))
    if zx_expr is not None and any(pads):
        # a run-time zx cannot be a pad value: pad with zeros, and take zx's share over the taps inside
        # the image only (one-channel float convs over a mask; a pad of x with zx cost an NCHW pass of its own)
        acc = _CONV[nsp](x, relax.const(wv), padding=pads, groups=groups, **common)
        wsum = wv.astype(np.int64).reshape(wv.shape[0], wv.shape[1], -1).sum(axis=1).reshape(wv.shape[0], 1,
                                                                                         *wv.shape[2:])
        acc = relax.op.subtract(acc, relax.op.multiply(zx_expr, _valid_tap_sums(bb, x, wsum, pads, common)))
        if np.any(zw != 0):
            taps = _valid_tap_sums(bb, x, np.full((1, 1, *wv.shape[2:]), wv.shape[1]), pads, common)
            box = _window_sums(bb, x, pads, relax.op.multiply(zx_expr, taps), wv.shape, groups, common)
            acc = relax.op.subtract(acc, relax.op.multiply(zw_view, box))
        return acc
    data, padding = x, pads
    if any(pads) and (zx != 0 or np.any(zw != 0)):
        widths = pad_widths("NC" + "DHW"[3 - nsp:], pads)
        data, padding = bb.normalize(relax.op.nn.pad(x, widths, pad_value=float(zx))), [0] * (2 * nsp)
    acc = _CONV[nsp](data, relax.const(wv), padding=padding, groups=groups, **common)
    wsum = wv.astype(np.int64).reshape(wv.shape[0], -1).sum(axis=1).astype(np.int32).reshape([1, -1] + spatial)
    if zx_expr is not None:
        acc = relax.op.subtract(acc, relax.op.multiply(relax.const(wsum), zx_expr))
    elif zx != 0:
        acc = relax.op.subtract(acc, relax.const(wsum * zx))
    if np.any(zw != 0):
        share = zx_expr if zx_expr is not None else relax.const(np.int32(zx))
        box = _window_sums(bb, data, [0] * (2 * nsp), relax.op.multiply(share, relax.const(np.int32(wv[0].size))),
                           wv.shape, groups, common)
        acc = relax.op.subtract(acc, relax.op.multiply(zw_view, box))
    return acc


def _window_sums(bb, data, pads: list[int], minus, wshape, groups: int, common: dict):
    """``sum over a window and its group's channels of (data - zx)`` (``minus``: zx times the taps summed),
    one value per group and output pixel, repeated to the group's output channels: ``[N, M, *out]`` in int32.
    The sum is itself an 8-bit conv, with a kernel of ones and one output channel per group, so it runs on the
    same int8 kernels as the conv (a channel sum in int32 then a window sum took 0.2 ms per conv of ddddocr's
    recognizer in reshapes and casts, as long as the conv)."""
    nsp = len(wshape) - 2
    ones = relax.const(np.ones((groups, *wshape[1:]), np.int8))
    box = _CONV[nsp](data, ones, padding=pads, groups=groups, **common)
    box = bb.normalize(relax.op.subtract(box, minus))
    out_per_group = int(wshape[0]) // groups
    return relax.op.repeat(box, out_per_group, axis=1) if out_per_group > 1 else box
