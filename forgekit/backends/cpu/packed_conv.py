"""Legalize NHWC conv2d (and matmul with a constant [K, N] weight) against weights pre-packed
at compile time so the micro-kernel streams them contiguously.

conv2d: HWIO [KH, KW, IC/g, OC] -> [OC/vt, KH, KW, IC/g, vt], vt = the vector tile the conv rule
will pick (same `choose_tiles`), so for each output-channel tile the whole reduction reads one
contiguous panel (HWIO with OC=512 walks the weights with a 2 KiB stride, which aliases in L1).
matmul: [K, N] -> [N/vt, K, vt] likewise.  Packing is numpy on the constant, no TIR JIT.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import tvm
from tvm import relax, te, topi

from . import winograd
from .dynamic_matmul import legalize_dynamic_matmul
from .tiling import (STREAMING_BYTES, choose_tiles, layout_tile, padded_columns, padded_rows, round_up,
                     symbolic_factor)

if TYPE_CHECKING:
    from ...targets.isa import IsaInfo

#: a LegalizeOps function: (BlockBuilder, call) -> the call's lowered form
Legalize = Callable[[Any, Any], Any]


def _const_value(e: Any) -> np.ndarray | None:
    if isinstance(e, tvm.ir.expr.Constant):
        v = e.value
        return v.numpy() if hasattr(v, "numpy") else None
    return None


def _default(bb: Any, call: Any) -> Any:
    """Fall back to the op's stock legalization."""
    return tvm.ir.Op.get(call.op.name).get_attr("FLegalize")(bb, call)


def _ints(x: Any) -> list[int]:
    return [int(v) for v in x]


def _int_or_expr(v: Any) -> Any:
    """A shape value as a Python int when static, else the symbolic expression itself."""
    return int(v) if isinstance(v, tvm.tirx.IntImm) else v


def conv_geometry(attrs: Any, h: Any, w: Any, kh: int,
                  kw: int) -> tuple[list[int], list[int], list[int], tuple[Any, Any]]:
    """(strides, dilation, padding top/left/bottom/right, output height and width) of a conv2d's attributes
    (``h``, ``w`` and the output size may be symbolic expressions)."""
    sh, sw = _ints(attrs.strides)
    dh, dw = _ints(attrs.dilation)
    pt, pl, pb, pr = _ints(attrs.padding)
    return [sh, sw], [dh, dw], [pt, pl, pb, pr], ((h + pt + pb - dh * (kh - 1) - 1) // sh + 1,
                                                  (w + pl + pr - dw * (kw - 1) - 1) // sw + 1)


#: fp32 holds every integer up to 2**24 exactly: an int8/uint8 x int8 convolution whose reduction is
#: short enough (|sum| <= K * 128 * 255) computes exactly in fp32, on the fast fp32 kernels
_FP32_EXACT = 2 ** 24


def exact_in_fp32(call: Any, w: np.ndarray) -> bool:
    """Whether the integer conv2d ``call`` (int8/uint8 data, int8 constant weight ``w``, int32 out) can
    run in fp32 without rounding: every partial sum stays below 2**24."""
    data = call.args[0]
    if str(data.ty.dtype) not in ("int8", "uint8") or str(call.attrs.out_dtype) != "int32":
        return False
    if w is None or str(w.dtype) != "int8":
        return False
    kh, kw, icg, _ = w.shape
    return kh * kw * icg * 128 * 255 < _FP32_EXACT


def _rounded_width(ow: Any, rt: int) -> Any:
    """A symbolic output width rounded up to the register tile, or ``ow`` itself when it already is a multiple
    (``4 * (W / 32)`` for a 4-row tile: no extra columns, no slice)."""
    if tvm.sym.Analyzer().can_prove(tvm.tirx.floormod(ow, rt) == 0):
        return ow
    return round_up(ow, rt)


def make_conv2d_legalize(tinfo: IsaInfo) -> Legalize:
    def _legalize(bb: Any, call: Any) -> Any:
        a = call.attrs
        data, weight = call.args
        w = _const_value(weight)
        if a.data_layout != "NHWC" or a.kernel_layout != "HWIO" or a.out_layout != "NHWC":
            return _default(bb, call)
        # integer convolutions that fp32 computes exactly (depthwise int8: 9 taps) take the fp32
        # kernel: exact, and 2x the stock integer schedule (no integer FMA without VNNI dot products)
        int_exact = exact_in_fp32(call, w)
        if not int_exact and str(a.out_dtype) not in ("", "None", "void", "float32"):
            return _default(bb, call)
        if w is None or (str(data.ty.dtype) != "float32" and not int_exact) or data.ty.shape is None:
            return _default(bb, call)
        if int_exact:
            w = w.astype(np.float32)
        n, h, wd, ic = data.ty.shape.values  # batch, height and width may be symbolic; channels not
        if not isinstance(ic, tvm.tirx.IntImm):
            return _default(bb, call)
        n, h, wd = (_int_or_expr(v) for v in (n, h, wd))
        kh, kw, icg, oc = w.shape
        groups = int(a.groups)
        (sh, sw), (dh, dw), (pt, pl, pb, pr), (oh, ow) = conv_geometry(a, h, wd, kh, kw)
        if not isinstance(ow, int) or not isinstance(oh, int):
            # Relax's own (simplified) output extents: buffers of the same var must be structurally
            # equal when FuseTIR merges kernels, and ``(W + 2 - 3) // 1 + 1`` is not ``W``
            _, oh, ow, _ = (_int_or_expr(v) for v in call.ty.shape.values)
        lanes = tinfo.vec_lanes
        if not int_exact and winograd.applies(a, w, (n, h, wd, int(ic)), lanes):
            return winograd.emit(bb, data, w, (n, h, wd, int(ic)), (n, oh, ow, oc), tinfo,
                                 winograd.choose((n, oh, ow, oc), int(ic)), dilation=dh, pad=(pt, pl))
        ocp = oc
        if groups == 1 and (ocp := padded_columns(oc, tinfo)) != oc:
            # e.g. 1000 classes: compute 1008 channels with zero weights, slice in the epilogue,
            # so the micro-kernel keeps full-width vectors
            w = np.concatenate([w, np.zeros((kh, kw, icg, ocp - oc), w.dtype)], axis=3)
        wrows = padded_rows(ocp, ow, tinfo) if isinstance(ow, int) else None  # a prime width: a few more
        vt, rt = choose_tiles(ocp, wrows, tinfo, symbolic_factor(ow) if wrows is None else 1)
        if ocp % vt:
            return _default(bb, call)
        vt = layout_tile(ocp, wrows, tinfo)  # the packing's; the rule keeps its own
        owp = (ow if wrows == ow else wrows) if wrows is not None else _rounded_width(ow, rt)
        packed = np.ascontiguousarray(
            w.reshape(kh, kw, icg, ocp // vt, vt).transpose(3, 0, 1, 2, 4))
        ocg = oc // groups

        def f(x: Any, wp: Any) -> Any:
            if pt or pl or pb or pr:
                x = topi.nn.pad(x, [0, pt, pl, 0], [0, pb, pr, 0], name="pad_temp")
            ry = te.reduce_axis((0, kh), "ry")
            rx = te.reduce_axis((0, kw), "rx")
            rc = te.reduce_axis((0, icg), "rc")
            if groups == 1:
                cidx = lambda ff, c: c  # noqa: E731
            else:
                cidx = lambda ff, c: ff // ocg * icg + c  # noqa: E731
            col = (lambda xx: xx) if owp is ow else (lambda xx: tvm.tirx.min(xx, ow - 1))  # noqa: E731
            out = te.compute(
                (n, oh, owp, ocp),
                lambda b, y, xx, ff: te.sum(
                    x[b, y * sh + ry * dh, col(xx) * sw + rx * dw, cidx(ff, rc)].astype("float32")
                    * wp[ff // vt, ry, rx, rc, ff % vt], axis=[ry, rx, rc]),
                name="conv2d_nhwc")
            if ocp != oc or owp is not ow:
                out = te.compute((n, oh, ow, oc), lambda *i: out(*i), name="T_slice_oc")
            if int_exact:
                out = te.compute((n, oh, ow, oc), lambda *i: out(*i).astype("int32"), name="T_exact_int")
            return out
        return bb.call_te(f, data, relax.const(packed), primfunc_name_hint="conv2d")
    return _legalize


def make_matmul_legalize(tinfo: IsaInfo) -> Legalize:
    def _legalize(bb: Any, call: Any) -> Any:
        x, weight = call.args
        w = _const_value(weight)
        if w is None:
            dynamic = legalize_dynamic_matmul(bb, call, tinfo)
            return dynamic if dynamic is not None else _default(bb, call)
        if w.ndim != 2 or str(x.ty.dtype) != "float32" or x.ty.shape is None:
            return _default(bb, call)
        if str(call.attrs.out_dtype) not in ("", "None", "void", "float32"):
            return _default(bb, call)
        xs = list(x.ty.shape.values)
        if len(xs) < 2:
            return _default(bb, call)
        if not isinstance(xs[-1], tvm.tirx.IntImm):  # rows (M) and batch dims may stay symbolic
            return _default(bb, call)
        xs = [_int_or_expr(v) for v in xs]
        k, nn = w.shape
        if (npad := padded_columns(nn, tinfo)) != nn:  # e.g. 1000 classes -> 1008, sliced in the epilogue
            w = np.concatenate([w, np.zeros((k, npad - nn), w.dtype)], axis=1)
        # the row axis: M, or the axis before a 1-long M ([T, 1, K] x [K, N]: a time-major GRU/LSTM input
        # projection, whose rows are the time steps; tiled one row at a time it ran at 1/3 of numpy's sgemm)
        ra = len(xs) - 3 if len(xs) >= 3 and xs[-2] == 1 else len(xs) - 2
        m = xs[ra]
        mrows = padded_rows(npad, m, tinfo) if isinstance(m, int) else None  # a prime M: a few more rows
        vt, rt = choose_tiles(npad, mrows, tinfo, streaming=k * npad * w.itemsize >= STREAMING_BYTES)
        if npad % vt or vt == npad:
            return _default(bb, call)
        vt = wide if (wide := layout_tile(npad, mrows, tinfo)) != npad else vt
        packed = np.ascontiguousarray(w.reshape(k, npad // vt, vt).transpose(1, 0, 2))
        lead = xs[:-1]
        mp = (m if mrows == m else mrows) if mrows is not None else round_up(m, rt)
        row = (lambda i: i) if mp is m else (lambda i: tvm.tirx.min(i, m - 1))  # noqa: E731
        shape = [mp if j == ra else d for j, d in enumerate(lead)]

        def rows(i: Any) -> tuple:
            return tuple(row(v) if j == ra else v for j, v in enumerate(i))

        def f(a: Any, bp: Any) -> Any:
            r = te.reduce_axis((0, k), "k")
            out = te.compute(
                (*shape, npad),
                lambda *i: te.sum(a[(*rows(i[:-1]), r)] * bp[i[-1] // vt, r, i[-1] % vt], axis=[r]),
                name="matmul")
            if npad != nn or mp is not m:
                out = te.compute((*lead, nn), lambda *i: out(*i), name="T_slice_n")
            return out
        return bb.call_te(f, x, relax.const(packed), primfunc_name_hint="matmul")
    return _legalize
