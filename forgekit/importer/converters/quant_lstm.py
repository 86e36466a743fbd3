"""com.microsoft DynamicQuantizeLSTM, computed as onnxruntime computes it (issue 39).

Apart from :mod:`.quant` for its size: it builds on that module's ``DynamicQuantizeLinear`` and
``MatMulInteger`` and on :mod:`.rnn`'s LSTM, whose loop kernel (:mod:`.recurrence`) quantizes each step's state.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ._common import OnnxOpConverter, const_value, ndim_of
from .quant import DynamicQuantizeLinear, MatMulInteger, _pad
from .rnn import LSTM, _take


class DynamicQuantizeLSTM(OnnxOpConverter):
    """com.microsoft DynamicQuantizeLSTM as onnxruntime computes it: ``X`` is quantized to uint8 with its own
    range (:class:`DynamicQuantizeLinear`) and multiplied by the integer input weights (:class:`MatMulInteger`:
    forgekit's int8 kernels for int8 weights), and every step quantizes the previous ``h`` the same way
    before its integer product with the recurrent weights (``recurrence._quantize_state``; the weights stream as
    int8, or int16 when a zero point needs it, and the integer products sum exactly in float32 below 2^24).  Each product is scaled by ``scale_x * scale_w`` per column, as MLAS's
    output processor does.  Dequantizing the weights and running a float LSTM instead was 0.4 % of the output
    range away from onnxruntime on ddddocr's recognizer (issue 39).  Variants the loop kernel does not compute
    (clip, peepholes, ...) still run that float LSTM on the dequantized weights."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        op = relax.op
        ins = _pad(inputs, 12)
        X, W, R, B, seq_lens, h0, c0, P, w_s, w_zp, r_s, r_zp = ins[:12]

        def scales(s, q):  # [D] or [D, 4H] -> [D, 4H]
            s = bb.normalize(op.astype(s, "float32"))
            cols = q.ty.shape.values[2]
            return bb.normalize(op.broadcast_to(op.reshape(s, [-1, 1]), [q.ty.shape.values[0], cols])
                                if ndim_of(s) == 1 else s)

        def integers(q, zp):  # q: [D, K, 4H] -> [D, 4H, K] q - zp in float32
            qf = op.astype(q, "float32")
            if zp is not None:
                z = bb.normalize(op.astype(zp, "float32"))
                qf = op.subtract(qf, op.reshape(z, [-1, 1, 1]) if ndim_of(z) == 1 else op.expand_dims(z, axis=1))
            return bb.normalize(op.permute_dims(qf, [0, 2, 1]))

        ws, rs = scales(w_s, W), scales(r_s, R)
        wi, ri = integers(W, w_zp), integers(R, r_zp)
        Wf = bb.normalize(op.multiply(wi, op.expand_dims(ws, axis=2)))
        Rf = bb.normalize(op.multiply(ri, op.expand_dims(rs, axis=2)))
        # X @ W per direction in int32, one range for all of X (as onnxruntime), then the scales
        xq = bb.emit(DynamicQuantizeLinear._impl_v11(bb, [X], {}, {}))
        xs, xzp = bb.emit(relax.TupleGetItem(xq, 1)), bb.emit(relax.TupleGetItem(xq, 2))
        xq = bb.emit(relax.TupleGetItem(xq, 0))
        xws = []
        for d in range(int(W.ty.shape.values[0])):
            w_d, zp_d = _take(bb, W, d), _take(bb, w_zp, d) if w_zp is not None else None
            acc = MatMulInteger._impl_v10(bb, [xq, w_d, xzp, zp_d], {}, {})
            scale_d = op.multiply(xs, op.squeeze(op.strided_slice(ws, [0], [d], [d + 1]), [0]))
            xws.append(bb.emit(op.multiply(op.astype(acc, "float32"), scale_d)))
        # R - zp fits int8 for int8 weights without a zero point, else int16 (uint8 less 0..255)
        rzv = const_value(r_zp) if r_zp is not None else np.zeros((), np.int8)
        narrow = str(R.ty.dtype) == "int8" and rzv is not None and not np.any(rzv)
        return LSTM._convert(bb, [X, Wf, Rf, B, seq_lens, h0, c0, P], attr,
                             quant=(xws, ri, rs, "int8" if narrow else "int16"))


CONVERTERS = {"DynamicQuantizeLSTM": DynamicQuantizeLSTM}
