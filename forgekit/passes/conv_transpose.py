"""Transposed convolutions as one convolution on their input and a depth-to-space shuffle (sub-pixel
decomposition), so that forgekit's scheduled conv kernels (fp32 and bf16) run them.

TVM 0.27 legalizes ``conv2d_transpose`` only in NCHW, as an unscheduled loop nest (forgekit has no rule
for it): PP-OCRv4 det's two 2x2/stride-2 heads took 22 % of the model's time, a ViT's decoder half of its
time at ~44 GFLOP/s, and bf16 builds ran it in fp32.

With stride ``s``, padding cropped afterwards and ``oh' = oh + pad_top``, ``y[oh'] = sum_{h*s + i = oh'}
x[h] * W[i]``.  Output rows of phase ``r = oh' mod s`` (``oh' = s*a + r``) take only the taps ``i = r + s*t``:
``y[s*a + r] = sum_t x[a - t] * W[r + s*t]``, a correlation of ``x`` (padded by ``T - 1``,
``T = ceil(K / s)``) with those taps reversed.  All ``s*s`` phases (rows x columns) are one convolution to
``s*s*Cout`` channels (phase-major: channel ``(rh*s + rw)*Cout + o``) with ``T x T`` kernels, whose output
rows and columns interleave (reshape, transpose) and are cropped by the padding.  Where ``K`` is not a
multiple of ``s`` some phases have fewer than ``T`` real taps (3x3/stride 2: 2x2, 2x1, 1x2 and 1x1), and each
phase is its own convolution over its real taps, concatenated (:func:`_phase_convs`): every multiply is one
the transposed convolution makes.  ``stride == kernel`` (U-Net/DB upsampling) is ``T = 1``: a 1x1
convolution and a pixel shuffle, nothing cropped.

Why not a library pass: TVM has no such rewrite (its ``conv2d_transpose`` strategy lives in the removed
Relay TOPI schedules), and onnxscript's/onnxslim's optimizers keep ConvTranspose as it is.  Why not zero
insertion + convolution: stride 2 would multiply 3 zeros for every real term.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .batchnorm import has_op


def _eligible(attrs: Any, w: np.ndarray, shape: Any, cast: bool = False) -> bool:
    """Constant IOHW weights on NCHW data, one group, no dilation, and per axis ``stride == kernel`` (any size)
    or stride 1-2 with a kernel of 1-4 (what the tests cover); others keep TVM's loop nest.  ``cast``: the
    result is cast back to the weights' dtype (an fp16 build's fp32 accumulator), so any ``out_dtype`` goes."""
    if (w.ndim != 4 or attrs.data_layout != "NCHW" or attrs.kernel_layout != "IOHW"
            or attrs.out_layout not in ("", "NCHW") or int(attrs.groups) != 1
            or any(int(d) != 1 for d in attrs.dilation) or shape is None or len(shape) != 4
            or (not cast and attrs.out_dtype and str(attrs.out_dtype) not in ("", str(w.dtype)))):
        return False
    strides = [int(s) for s in attrs.strides]
    return all(s == k or (s in (1, 2) and 1 <= k <= 4) for s, k in zip(strides, w.shape[2:]))


def phase_weights(w: np.ndarray, strides: tuple[int, int]) -> np.ndarray:
    """IOHW transposed-conv weights -> OIHW weights of the phase convolution (``s*s*Cout`` outputs, ``T x T``)."""
    cin, cout, kh, kw = w.shape
    (sh, sw), (th, tw) = strides, (-(-kh // strides[0]), -(-kw // strides[1]))
    out = np.zeros((sh, sw, cout, cin, th, tw), w.dtype)
    for rh in range(sh):
        for u in range(th):
            i = rh + sh * (th - 1 - u)
            if i >= kh:
                continue
            for rw in range(sw):
                for v in range(tw):
                    j = rw + sw * (tw - 1 - v)
                    if j < kw:
                        out[rh, rw, :, :, u, v] = w[:, :, i, j].T
    return out.reshape(sh * sw * cout, cin, th, tw)


def _extent(size: Any, k: int, s: int, t: int, pad_lo: int, pad_hi: int, out_pad: int) -> tuple[Any, ...]:
    """Along one axis: the phase conv's padding (low, high), the interleaved rows to cut at the start, the
    conv's output length and the interleaved rows left past the output's end.  Whole phases of cropping are
    padding the conv leaves out, not rows it computes and a slice drops (a 3x3/stride-1/pad-1 transposed conv
    is a same-padded 3x3 conv, nothing sliced); output_padding past the last tap is more zero padding."""
    reduce = min(pad_lo // s, t - 1)
    lo, cut = t - 1 - reduce, pad_lo - s * reduce
    # conv output row a' holds interleaved rows s*a' + r; the output's row oh is interleaved row oh + cut, and
    # s*len - cut - out = s*(hi + 1) - k - out_pad + pad_hi (whatever the size): the fewest hi leaving it >= 0
    hi = max(0, -(-(k + out_pad - pad_hi) // s) - 1)
    return lo, hi, cut, size + lo + hi - t + 1, s * (hi + 1) - k - out_pad + pad_hi


def _phase_taps(k: int, s: int) -> list[int]:
    """The real taps of each of the ``s`` phases along one axis (``K - r`` taps ``r, r + s, ...``)."""
    return [-(-(k - r) // s) for r in range(s)]


def _phase_convs(relax: Any, x: Any, pw: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int],
                 pads: tuple[int, int, int, int], out_dtype: str = "") -> Any:
    """The phase convolution's output (NCHW, ``s*s*Cout`` phase-major channels): one ``T x T`` conv where every
    phase has ``T`` taps per axis; else one conv per phase over its real taps alone, concatenated.

    3x3/stride 2 (T = 2) has phases of 2x2, 2x1, 1x2 and 1x1 real taps: one 2x2 conv multiplied 16 taps per
    output quad for 9.  bench/bench_conv_transpose.py (128 -> 128 channels at 28x28, 2 threads of this Zen 4),
    conv kernels' GFLOP/s of real MACs, the 3x3 Conv's over the ConvTranspose's: fp32 6.16 -> 3.87-4.01, bf16
    7.23 -> 2.17-2.19; the four convs now run at the direct kernels' rate (fp32 95.6 GFLOP/s, a 2x2 Conv 101.8
    in the same run).  What is left is the Conv's Winograd (F(4x4, 3x3): 4x fewer multiplies in fp32), which no
    phase conv of a stride-2 3x3 gets.  A phase's missing taps are its first ones (the kernel is reversed), so
    its conv drops them with as much low padding: the same output size, concatenated."""
    (kh, kw), (sh, sw), (top, left, bottom, right) = kernel, strides, pads
    th, tw = pw.shape[2:]
    taps_h, taps_w = _phase_taps(kh, sh), _phase_taps(kw, sw)

    def conv(weights: np.ndarray, t: int, l: int) -> Any:
        y = relax.op.nn.conv2d(x, relax.const(np.ascontiguousarray(weights)), strides=[1, 1],
                               padding=[t, l, bottom, right], dilation=[1, 1], groups=1,
                               data_layout="NCHW", kernel_layout="OIHW", out_dtype=out_dtype or None)
        # an fp16 build's fp32 accumulator, rounded right after its conv: the same values the original cast
        # gave after the shuffle (which only moves them), and a conv + cast a GPU library takes as one
        return relax.op.astype(y, str(weights.dtype)) if out_dtype and out_dtype != str(weights.dtype) else y

    split = (set(taps_h) != {th} or set(taps_w) != {tw}) and min(taps_h + taps_w) > 0
    if not split or top < th - min(taps_h) or left < tw - min(taps_w):
        return conv(pw, top, left)  # no zero taps, or dropping them would need negative padding
    cout = pw.shape[0] // (sh * sw)
    parts = []
    for rh in range(sh):
        for rw in range(sw):
            block = pw[(rh * sw + rw) * cout:(rh * sw + rw + 1) * cout, :, th - taps_h[rh]:, tw - taps_w[rw]:]
            parts.append(conv(block, top - th + taps_h[rh], left - tw + taps_w[rw]))
    return relax.op.concat(parts, axis=1)


def conv_transpose_as_conv(mod: Any) -> Any:
    """Rewrite every eligible ``relax.nn.conv2d_transpose`` of ``mod`` (see the module docstring)."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    data, weight = wildcard(), is_const()
    pattern = is_op("relax.nn.conv2d_transpose")(data, weight)
    # an fp16 build's transposed conv: fp16 in, fp32 out (ToMixedPrecision), cast back to fp16 by its reader
    cast = is_op("relax.astype")(pattern)

    def rewrite(expr: Any, matched: Any) -> Any:
        call = matched[pattern]
        attrs, w, x = call.attrs, matched[weight].value.numpy(), matched[data]
        shape = getattr(x.ty, "shape", None)
        casting = cast in matched and str(getattr(expr.ty, "dtype", "")) == str(w.dtype)
        if cast in matched and not casting or not _eligible(attrs, w, getattr(shape, "values", None), casting):
            return expr
        _, cout, kh, kw = w.shape
        sh, sw = (int(s) for s in attrs.strides)
        th, tw = -(-kh // sh), -(-kw // sw)
        pt, pl, pb, pr = (int(p) for p in attrs.padding)
        oph, opw = (int(p) for p in attrs.output_padding)
        n, _, h, width = shape.values
        top, bottom, cut_t, a, over_h = _extent(h, kh, sh, th, pt, pb, oph)
        left, right, cut_l, b, over_w = _extent(width, kw, sw, tw, pl, pr, opw)
        y = _phase_convs(relax, x, phase_weights(w, (sh, sw)), (kh, kw), (sh, sw), (top, left, bottom, right),
                         str(attrs.out_dtype) if casting else "")
        if sh * sw > 1:
            # simplified sizes: ConvertLayout re-derives every shape from these expressions, and a model output
            # of ``(8 * H_div32 - 1 + 1) * 2`` rows is not its ``16 * H_div32``: "DataflowBlock Pass should not
            # rewrite ... any global-scope Var", so a dynamic-size PP-OCR det stayed NCHW (28x onnxruntime)
            simplify = tvm.sym.Analyzer().simplify
            a, b = simplify(a), simplify(b)
            y = relax.op.reshape(y, [n, sh, sw, cout, a, b])
            y = relax.op.permute_dims(y, [0, 3, 4, 1, 5, 2])  # n, o, a, rh, b, rw
            y = relax.op.reshape(y, [n, cout, simplify(a * sh), simplify(b * sw)])
        out_h = sh * (h - 1) + kh + oph - pt - pb
        out_w = sw * (width - 1) + kw + opw - pl - pr
        if cut_t or cut_l or over_h or over_w:
            y = relax.op.strided_slice(y, axes=[2, 3], begin=[cut_t, cut_l], end=[cut_t + out_h, cut_l + out_w])
        return y

    if not has_op(mod, "relax.nn.conv2d_transpose"):
        return mod
    functions = {gv: rewrite_call(pattern, rewrite, rewrite_call(cast, rewrite, func))
                 if isinstance(func, relax.Function) else func
                 for gv, func in mod.functions.items()}
    return tvm.IRModule(functions, attrs=mod.attrs)


def conv_transpose_as_conv_pass() -> Any:
    """:func:`conv_transpose_as_conv` as a module pass."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="forgekit.ConvTransposeAsConv")
    def rewrite(mod: Any, _ctx: Any) -> Any:
        return conv_transpose_as_conv(mod)

    return rewrite
