"""ONNX LSTM / GRU / RNN -> Relax: the time loop as one kernel (:mod:`.recurrence`), else unrolled over the
(static) sequence length.

Supported: directions forward / reverse / bidirectional, ``layout`` 0 and 1,
optional bias, ``initial_h`` / ``initial_c``, ``sequence_lens`` (masked: the
state stops updating and ``Y`` is zero past each sequence's length, which gives
the ONNX semantics for both directions), LSTM peepholes ``P`` and
``input_forget``, GRU ``linear_before_reset``, ``clip`` and the ONNX activation
list (with ``activation_alpha``/``activation_beta``).

The input projection ``X @ W^T + b`` is computed once for all time steps.  The loop
kernel covers the usual exports (default activations, no clip, peepholes, input_forget
or sequence_lens) with any sequence length, symbolic included; the rest is unrolled,
one ``H @ R^T`` matmul per step, and needs a static length.  The batch may be symbolic.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from . import recurrence
from ._common import OnnxOpConverter, attr_str, attr_strs, const, const_value, dtype_of, static_dim

# name -> (uses_alpha, uses_beta, default_alpha, default_beta)
_ACT_PARAMS = {
    "sigmoid": (False, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0),
    "relu": (False, False, 0.0, 0.0),
    "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0),
    "elu": (True, False, 1.0, 0.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "scaledtanh": (True, True, 1.0, 1.0),
    "affine": (True, True, 1.0, 0.0),
}


def _activations(attr, defaults: list[str], num_dir: int):
    names = attr_strs(attr, "activations") or defaults * num_dir
    if len(names) == len(defaults) and num_dir == 2:
        names = names * 2
    alphas = list(attr.get("activation_alpha", ()) or ())
    betas = list(attr.get("activation_beta", ()) or ())
    acts = []
    for n in names:
        key = n.lower()
        if key not in _ACT_PARAMS:
            raise ValueError(f"unsupported RNN activation '{n}'")
        ua, ub, da, db = _ACT_PARAMS[key]
        a = alphas.pop(0) if ua and alphas else da
        b = betas.pop(0) if ub and betas else db
        acts.append((key, float(a), float(b)))
    return acts


def _apply(act, x, dtype):
    key, a, b = act
    op = relax.op
    if key == "sigmoid":
        return op.sigmoid(x)
    if key == "tanh":
        return op.tanh(x)
    if key == "relu":
        return op.nn.relu(x)
    if key == "softsign":
        return op.divide(x, op.add(op.abs(x), const(1.0, dtype)))
    if key == "softplus":
        return op.log(op.add(op.exp(x), const(1.0, dtype)))
    if key == "leakyrelu":
        return op.nn.leakyrelu(x, a)
    if key == "thresholdedrelu":
        return op.where(op.greater(x, const(a, dtype)), x, op.zeros_like(x))
    if key == "elu":
        neg = op.multiply(const(a, dtype), op.subtract(op.exp(x), const(1.0, dtype)))
        return op.where(op.greater(x, const(0.0, dtype)), x, neg)
    if key == "hardsigmoid":
        return op.clip(op.add(op.multiply(x, const(a, dtype)), const(b, dtype)), 0.0, 1.0)
    if key == "scaledtanh":
        return op.multiply(const(a, dtype), op.tanh(op.multiply(x, const(b, dtype))))
    if key == "affine":
        return op.add(op.multiply(x, const(a, dtype)), const(b, dtype))
    raise AssertionError(key)


def _split(bb, x, n, axis=-1):
    cv = const_value(x)
    if cv is not None:  # weights: split in numpy (saves FoldConstant kernels at compile time)
        parts = np.split(cv, n if isinstance(n, int) else list(n), axis=axis)
        return [relax.const(np.array(p, order="C"), str(cv.dtype)) for p in parts]
    t = bb.emit(relax.op.split(x, n, axis=axis))
    count = n if isinstance(n, int) else len(n) + 1
    return [bb.emit(relax.TupleGetItem(t, i)) for i in range(count)]


def _take(bb, x, i, axis=0):
    """x[i] along ``axis`` (static i), dropping that axis."""
    cv = const_value(x)
    if cv is not None:
        return relax.const(np.array(np.take(cv, i, axis=axis), order="C"), str(cv.dtype))
    sl = relax.op.strided_slice(x, axes=[axis], begin=[i], end=[i + 1])
    return bb.emit(relax.op.squeeze(sl, axis=[axis]))


def _stack(values, axis):
    """``stack`` spelled as ``concat(expand_dims)``: TVM 0.27's ConvertLayout (run by forgekit's CPU
    schedules at opt_level >= 3) fails on ``relax.stack`` ("Index -1 out of bounds")."""
    return relax.op.concat([relax.op.expand_dims(v, axis) for v in values], axis=axis)


class _RNNBase(OnnxOpConverter):
    KIND = ""  # "lstm" | "gru" | "rnn"
    GATES = 1
    DEFAULT_ACTS: list[str] = []

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs, attr)

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs, attr)

    @classmethod
    def _impl_v14(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs, attr)

    @classmethod
    def _convert(cls, bb, inputs, attr, quant=None):
        """``quant``: onnxruntime's DynamicQuantizeLSTM (``(X @ W per direction, R - zp, R scales, dtype)``: the
        input projections already computed as onnxruntime does, without biases, in X's layout; the recurrent
        weights as integers in float32 in ONNX's ``[D, G*H, H]`` layout, their scales ``[D, G*H]``, and the
        integer dtype that holds them); the loop kernel quantizes each step's ``h`` as onnxruntime does
        (:class:`.quant_lstm.DynamicQuantizeLSTM`)."""
        op = relax.op
        inputs = list(inputs) + [None] * (8 - len(inputs))
        X, W, R, B, seq_lens, init_h = inputs[:6]
        init_c = inputs[6] if cls.KIND == "lstm" else None
        P = inputs[7] if cls.KIND == "lstm" else None
        layout = int(attr.get("layout", 0))
        direction = attr_str(attr, "direction", "forward")
        num_dir = 2 if direction == "bidirectional" else 1
        dtype = dtype_of(X)
        if layout == 1:
            X = bb.emit(op.permute_dims(X, [1, 0, 2]))
            if init_h is not None:
                init_h = bb.emit(op.permute_dims(init_h, [1, 0, 2]))
            if init_c is not None:
                init_c = bb.emit(op.permute_dims(init_c, [1, 0, 2]))
        Hs = int(attr["hidden_size"]) if "hidden_size" in attr else static_dim(R, 2, "hidden size")
        batch = X.ty.shape.values[1]
        clip = attr.get("clip")
        lbr = int(attr.get("linear_before_reset", 0))
        input_forget = int(attr.get("input_forget", 0))
        acts = _activations(attr, cls.DEFAULT_ACTS, num_dir)
        nact = len(cls.DEFAULT_ACTS)

        # the time loop as one kernel (recurrence.py) when it computes this configuration; else unrolled
        looped = dtype == "float32" and recurrence.supported(cls.KIND, attr, acts, seq_lens is not None, P is not None)
        T = None if looped else static_dim(X, 0, f"{cls.KIND.upper()} sequence length")
        # sequence_lens: mask only when it can cut a sequence short
        mask_lens = None
        if seq_lens is not None and not looped:
            sl = const_value(seq_lens)
            if sl is None or np.any(sl < T):
                mask_lens = seq_lens

        quant = quant if looped else None
        if quant is not None:  # the projections in [T, batch, G*H]
            quant = ([bb.emit(op.permute_dims(x, [1, 0, 2])) for x in quant[0]] if layout == 1 else quant[0],
                     *quant[1:])
        zeros_bh = bb.emit(op.zeros(relax.ShapeExpr([batch, Hs]), dtype))
        ys, yhs, ycs = [], [], []
        layer: list = []  # looped: (reverse, xw, weights, h0, c0) per direction, for one kernel
        for d in range(num_dir):
            reverse = direction == "reverse" or d == 1
            f_acts = acts[d * nact : (d + 1) * nact]
            Wd = _take(bb, W, d)  # [G*H, I]
            Rd = _take(bb, R if quant is None else quant[1], d)  # [G*H, H]
            xw = op.matmul(X, op.permute_dims(Wd)) if quant is None else quant[0][d]  # [T, batch, G*H]
            rb_h = None
            if B is not None:
                Bd = _take(bb, B, d)  # [2*G*H]
                wb, rb = _split(bb, Bd, 2, axis=0)
                if cls.KIND == "gru" and lbr:
                    rb_zr, rb_h = _split(bb, rb, [2 * Hs], axis=0)
                    wb = op.add(wb, op.concat([rb_zr, op.zeros(relax.ShapeExpr([Hs]), dtype)], axis=0))
                else:
                    wb = op.add(wb, rb)
                xw = op.add(xw, wb)
            xw = bb.emit(xw)
            if cls.KIND == "gru" and not lbr:
                R_zr, R_h = _split(bb, Rd, [2 * Hs], axis=0)
                R_zr_t = bb.emit(op.permute_dims(R_zr))
                R_h_t = bb.emit(op.permute_dims(R_h))
            else:
                R_t = bb.emit(op.permute_dims(Rd))
                if quant is not None:  # the integers in the narrowest type that holds them (recurrence.py)
                    R_t = bb.emit(op.astype(R_t, quant[3]))
            if P is not None and cls.KIND == "lstm":
                p_i, p_o, p_f = _split(bb, _take(bb, P, d), 3, axis=0)
            H = _take(bb, init_h, d) if init_h is not None else zeros_bh
            C = None
            if cls.KIND == "lstm":
                C = _take(bb, init_c, d) if init_c is not None else zeros_bh

            if looped:
                if cls.KIND == "gru" and not lbr:
                    weights = [R_zr_t, R_h_t]
                elif cls.KIND == "gru":
                    weights = [R_t, rb_h if rb_h is not None else bb.emit(op.zeros(relax.ShapeExpr([Hs]), dtype))]
                else:
                    weights = [R_t] + ([_take(bb, quant[2], d)] if quant is not None else [])
                layer.append((reverse, xw, weights, H, C))
                continue

            def clipped(x):
                return op.clip(x, -float(clip), float(clip)) if clip is not None else x

            y_steps = [None] * T
            order = range(T - 1, -1, -1) if reverse else range(T)
            for t in order:
                x_t = _take(bb, xw, t)  # [batch, G*H]
                if cls.KIND == "lstm":
                    g = bb.emit(op.add(x_t, op.matmul(H, R_t)))
                    gi, go, gf, gc = _split(bb, g, 4)
                    if P is not None:
                        gi = op.add(gi, op.multiply(p_i, C))
                        gf = op.add(gf, op.multiply(p_f, C))
                    i = bb.emit(_apply(f_acts[0], clipped(gi), dtype))
                    if input_forget:
                        f = op.subtract(const(1.0, dtype), i)
                    else:
                        f = _apply(f_acts[0], clipped(gf), dtype)
                    c_hat = _apply(f_acts[1], clipped(gc), dtype)
                    C_new = bb.emit(op.add(op.multiply(f, C), op.multiply(i, c_hat)))
                    if P is not None:
                        go = op.add(go, op.multiply(p_o, C_new))
                    o = _apply(f_acts[0], clipped(go), dtype)
                    H_new = bb.emit(op.multiply(o, _apply(f_acts[2], C_new, dtype)))
                elif cls.KIND == "gru":
                    x_zr, x_h = _split(bb, x_t, [2 * Hs])
                    if lbr:
                        hr = bb.emit(op.matmul(H, R_t))
                        h_zr, h_h = _split(bb, hr, [2 * Hs])
                        if rb_h is not None:
                            h_h = op.add(h_h, rb_h)
                        zr = bb.emit(_apply(f_acts[0], clipped(op.add(x_zr, h_zr)), dtype))
                        z, r = _split(bb, zr, 2)
                        h_hat = _apply(f_acts[1], clipped(op.add(x_h, op.multiply(r, h_h))), dtype)
                    else:
                        zr = bb.emit(_apply(f_acts[0], clipped(op.add(x_zr, op.matmul(H, R_zr_t))), dtype))
                        z, r = _split(bb, zr, 2)
                        h_hat = _apply(
                            f_acts[1], clipped(op.add(x_h, op.matmul(op.multiply(r, H), R_h_t))), dtype
                        )
                    H_new = bb.emit(
                        op.add(op.multiply(op.subtract(const(1.0, dtype), z), h_hat), op.multiply(z, H))
                    )
                else:  # rnn
                    H_new = bb.emit(_apply(f_acts[0], clipped(op.add(x_t, op.matmul(H, R_t))), dtype))

                if mask_lens is not None:
                    m = bb.emit(
                        op.expand_dims(
                            op.less(relax.const(t, dtype_of(mask_lens)), mask_lens), axis=1
                        )
                    )
                    y_steps[t] = bb.emit(op.where(m, H_new, zeros_bh))
                    H = bb.emit(op.where(m, H_new, H))
                    if C is not None:
                        C = bb.emit(op.where(m, C_new, C))
                else:
                    y_steps[t] = H_new
                    H = H_new
                    if C is not None:
                        C = C_new
            ys.append(bb.emit(_stack(y_steps, axis=0)))  # [T, batch, H]
            yhs.append(H)
            ycs.append(C)

        if looped:  # one kernel for the layer: its directions run in parallel
            revs, xws, weights, hs, cs = zip(*layer)
            Y, Y_h, Y_c = recurrence.emit_layer(
                bb, cls.KIND, Hs, revs, bool(lbr), bb.emit(_stack(xws, axis=0)),
                [bb.emit(_stack(w, axis=0)) for w in zip(*weights)], bb.emit(_stack(hs, axis=0)),
                bb.emit(_stack(cs, axis=0)) if cls.KIND == "lstm" else None, quant=quant and quant[3])
        else:
            Y = bb.emit(_stack(ys, axis=1))  # [T, D, batch, H]
            Y_h = bb.emit(_stack(yhs, axis=0))  # [D, batch, H]
            Y_c = bb.emit(_stack(ycs, axis=0)) if cls.KIND == "lstm" else None
        if layout == 1:
            Y = bb.emit(op.permute_dims(Y, [2, 0, 1, 3]))
            Y_h = bb.emit(op.permute_dims(Y_h, [1, 0, 2]))
            if Y_c is not None:
                Y_c = bb.emit(op.permute_dims(Y_c, [1, 0, 2]))
        outs = [Y, Y_h] + ([Y_c] if Y_c is not None else [])
        # Inside an If branch TVM's frontend binds a one-output node to the converter's whole result: give
        # it only the outputs the node declares (it says how many there; the main graph picks by index)
        declared = (attr.get("tvm_custom") or {}).get("num_outputs")
        if declared == 1:
            return Y
        return relax.Tuple(outs[:declared] if declared else outs)


class LSTM(_RNNBase):
    KIND = "lstm"
    GATES = 4
    DEFAULT_ACTS = ["Sigmoid", "Tanh", "Tanh"]


class GRU(_RNNBase):
    KIND = "gru"
    GATES = 3
    DEFAULT_ACTS = ["Sigmoid", "Tanh"]


class RNN(_RNNBase):
    KIND = "rnn"
    GATES = 1
    DEFAULT_ACTS = ["Tanh"]


CONVERTERS = {"LSTM": LSTM, "GRU": GRU, "RNN": RNN}
