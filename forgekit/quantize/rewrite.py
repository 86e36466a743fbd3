"""The Relax rewrite: float conv2d/conv1d/matmul with constant weights -> integer compute.

For each quantizable op ``y = conv2d(x, W)`` (or ``conv1d``, ``matmul``) with a plan, the rewrite emits::

    xq  = astype(clip(round(x * (1 / sx)), lo, hi), "int8" | "uint8")    # fuses into the producer's epilogue
    acc = conv2d(xq, Wq, out_dtype="int32")                               # int8 weights, int32 accumulation
                                                                          # (conv1d: the CPU pipeline makes it a conv2d)
    y   = astype(acc, "float32") * (sx * sw)                              # requant/dequant in the epilogue

``sw`` is per output channel (``per_channel``) or per tensor; weights are symmetric int8 in [-127, 127].
With a dynamic plan ``sx = max(|x|) / 127`` is computed at run time.  The quantize step is elementwise, so
FuseOps puts it at the end of the *previous* kernel (the requantization of its output) and the dequantize
into this kernel's epilogue together with the bias/ReLU that follow; the integer conv/matmul itself is
scheduled by the int8 rules of :mod:`forgekit.schedules`.

Every quantizable op's output is bound to a variable named ``fkq_<index>`` (also the ones kept in fp32),
which is how the accuracy report finds the per-layer tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..passes.padding import pad_widths
from . import graph

#: activation dtype -> (lowest, highest) integer value; int8 stays symmetric so zero padding is exact
DTYPE_RANGE = {"int8": (-127, 127), "uint8": (0, 255)}


@dataclass
class OpPlan:
    """How to quantize one op: a static activation scale (None: dynamic) and its integer dtype."""

    x_scale: float | None
    x_dtype: str
    per_channel: bool
    #: SmoothQuant factors per input channel of a matmul (x / s, s * W), None: no smoothing
    smooth: np.ndarray | None = None
    #: uint8 only: the integer that stands for 0.0 (``x = x_scale * (q - zero_point)``)
    zero_point: int = 0
    #: calibrated mean of each input channel: bias correction subtracts ``(dequant(Wq) - W) @ mean``,
    #: the systematic part of the weight rounding error; None: no correction
    input_mean: np.ndarray | None = None


def weight_error_bias(w: np.ndarray, dequantized: np.ndarray, mean: np.ndarray, is_conv: bool,
                      groups: int) -> np.ndarray:
    """Expected output shift per output channel caused by using ``dequantized`` weights for ``w``.

    Rounding errors of one output channel's weights do not average out when its inputs have a non-zero
    mean (post-ReLU/hardswish activations always have): ``sum_k dW[o, k] * mean[k]`` is a constant offset
    of that channel.  Measured on PP-OCRv4 rec, weight-only int8: output cosine 0.9919 without the
    correction, 0.9991 with it.  (Padded borders see zeros, not the mean: the small error this leaves
    is ignored, as in Nagel et al. 2019.)
    """
    dw = (dequantized - w).astype(np.float64)
    if not is_conv:  # [K, N]
        return (mean.astype(np.float64) @ dw).astype(np.float32)
    per_in = dw.sum(axis=tuple(range(2, dw.ndim)))  # [O, I/groups], over the kernel window (OIHW, OIW)
    out_per_group = per_in.shape[0] // groups
    means = mean.astype(np.float64).reshape(groups, -1)[np.arange(per_in.shape[0]) // out_per_group]
    return (per_in * means).sum(axis=1).astype(np.float32)


def quantize_weight(w: np.ndarray, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights and their scale: one per output channel (axis 0 of OIHW, axis 1 of [K, N])
    or one for the tensor.  ``w`` must already be laid out output-channel first."""
    flat = np.abs(w.reshape(w.shape[0], -1)).max(axis=1) if per_channel else np.full(w.shape[0], np.abs(w).max())
    scale = np.where(flat > 0, flat / 127.0, 1.0).astype(np.float32)
    shaped = scale.reshape((-1,) + (1,) * (w.ndim - 1))
    return np.clip(np.round(w / shaped), -127, 127).astype(np.int8), scale


def _rewriter_class() -> Any:
    from tvm import relax

    @relax.expr_functor.mutator
    class Rewriter(relax.PyExprMutator):
        def __init__(self, mod: Any, plans: dict[int, OpPlan], gates: Any = None) -> None:
            super().__init__(mod)
            self.plans = plans
            self.index = 0
            self.gates = gates  # a [ops] float32 Var: op i computes in int8 where gates[i] > 0.5, else fp32

        def _emit_final(self, binding: Any, value: Any, idx: int) -> None:
            name = f"fkq_{idx}"
            if isinstance(binding.var, relax.DataflowVar) or not self.builder_.current_block_is_dataflow():
                new = self.builder_.emit(value, name)
            else:
                new = self.builder_.emit_output(value, name)
            self.set_var_remap(binding.var, new)

        def visit_var_binding_(self, binding: Any) -> None:
            call = binding.value
            if not graph.is_quantizable(call):
                return super().visit_var_binding_(binding)
            idx = self.index
            self.index += 1
            plan = self.plans.get(idx)
            x = self.visit_expr(call.args[0])
            if plan is None:  # kept in fp32
                self._emit_final(binding, relax.Call(call.op, [x, call.args[1]], call.attrs), idx)
                return None
            value = self._quantized(call, x, plan)
            if self.gates is not None:
                value = self._gated(call, x, value, idx)
            self._emit_final(binding, value, idx)
            return None

        def _gated(self, call: Any, x: Any, quantized: Any, idx: int) -> Any:
            """``where(gates[idx] > 0.5, quantized, the float op)``: both computed, one picked at run time."""
            op, emit = relax.op, self.builder_.emit
            q = emit(quantized)
            f = emit(relax.Call(call.op, [x, call.args[1]], call.attrs))
            on = emit(op.greater(op.take(self.gates, relax.const(idx, "int64"), axis=0),
                                 relax.const(np.float32(0.5))))
            return op.where(on, q, f)

        def _quantized(self, call: Any, x: Any, plan: OpPlan) -> Any:
            op = relax.op
            emit = self.builder_.emit
            f32 = lambda v: relax.const(np.asarray(v, np.float32))  # noqa: E731
            w0 = w = call.args[1].value.numpy()
            is_conv = graph.is_conv(call)
            # per-channel vectors broadcast over the kernel window of OIHW / OIW weights, and over the
            # spatial axes of NCHW / NCW tensors
            window = (1,) * (w.ndim - 2)
            smooth = 1.0
            if plan.smooth is not None:  # (x / s) @ (s * W) == x @ W, with the outlier channels tamed
                if not is_conv:
                    smooth = plan.smooth[:, None]
                elif int(call.attrs.groups) == 1:
                    smooth = plan.smooth.reshape(1, -1, *window)
                else:  # depthwise: filter c reads input channel c only
                    smooth = plan.smooth.reshape(-1, 1, *window)
                w = (w * smooth).astype(np.float32)
            wq, ws = quantize_weight(w if is_conv else w.T, plan.per_channel)
            if not is_conv:
                wq = np.ascontiguousarray(wq.T)
            # per-output-channel constants broadcast over NCHW / NCW conv outputs / the last axis of matmuls
            channel_shape = (1, -1, *window) if is_conv else (-1,)
            offset = np.zeros(ws.shape, np.float32)
            if plan.input_mean is not None:
                deq_w = wq * (ws.reshape(-1, 1, *window) if is_conv else ws[None, :]) / smooth
                offset -= weight_error_bias(w0, deq_w, plan.input_mean, is_conv,
                                            int(call.attrs.groups) if is_conv else 1)
            lo, hi = DTYPE_RANGE[plan.x_dtype]
            if plan.x_scale is None:  # dynamic: the activation range of this very input
                absmax = emit(op.max(op.abs(x)))
                sx = emit(op.maximum(op.divide(absmax, f32(hi)), f32(1e-8)))
                scaled = emit(op.divide(x, sx))
            else:
                sx = f32(plan.x_scale)
                inv = 1.0 / plan.x_scale if plan.smooth is None else (1.0 / (plan.x_scale * plan.smooth))
                if plan.smooth is not None and is_conv:
                    inv = inv.reshape(1, -1, *window)
                scaled = emit(op.multiply(x, f32(np.asarray(inv, np.float32))))
            # maximum/minimum rather than clip: clip has no layout inference, so ConvertLayout would wrap it
            # in NHWC->NCHW->NHWC transposes that break the requantization out of the conv epilogue
            # floor(x + 0.5) rather than round: TVM lowers round to a scalar libm-style sequence that is
            # ~12x slower than the vectorized floor (ties round up instead of to even: irrelevant here)
            rounded = op.floor(op.add(scaled, f32(plan.zero_point + 0.5)))
            clipped = op.minimum(op.maximum(rounded, f32(lo)), f32(hi))
            xq = emit(op.astype(clipped, plan.x_dtype))
            if is_conv:
                a = call.attrs
                conv = op.nn.conv2d if call.op.name == "relax.nn.conv2d" else op.nn.conv1d
                padding = [int(p) for p in a.padding]
                if plan.zero_point and any(padding):
                    # the border must read as 0.0, which is q = zero_point, and a conv pads with q = 0: pad
                    # explicitly (the pad then keeps NHWC: passes.quantize_layout) and let the conv pad nothing
                    xq = emit(op.nn.pad(xq, pad_widths(str(a.data_layout), padding),
                                        pad_value=float(plan.zero_point)))
                    padding = [0] * len(padding)
                acc = emit(conv(xq, relax.const(wq), strides=a.strides, padding=padding,
                                dilation=a.dilation, groups=a.groups, out_dtype="int32"))
            else:
                acc = emit(op.matmul(xq, relax.const(wq), out_dtype="int32"))
            deq = emit(op.astype(acc, "float32"))
            if plan.x_scale is None:
                return op.multiply(op.multiply(deq, sx), f32(ws.reshape(channel_shape)))
            scale = f32(np.float32(plan.x_scale) * ws.reshape(channel_shape))
            if plan.zero_point:
                # sum_k (q_k - zp) * Wq_k = acc - zp * sum_k Wq_k: a per-output-channel constant, folded
                # into the dequantize of the epilogue (padding reads zero_point, so it adds nothing)
                wsum = wq.astype(np.int64).sum(axis=tuple(range(1, wq.ndim)) if is_conv else 0)
                offset -= np.float32(plan.x_scale) * ws * (plan.zero_point * wsum).astype(np.float32)
            if not offset.any():
                return op.multiply(deq, scale)
            return op.add(op.multiply(deq, scale), f32(offset.reshape(channel_shape)))

    return Rewriter


def rewrite(mod: Any, plans: dict[int, OpPlan]) -> Any:
    """``mod`` with every op in ``plans`` (by quantizable-op index) lowered to integer compute."""
    import tvm
    from tvm import relax

    rewriter = _rewriter_class()(mod, plans)
    func = rewriter.visit_expr(mod["main"])
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    out["main"] = func
    return relax.transform.Normalize()(out)


def gated_rewrite(mod: Any, plans: dict[int, OpPlan], ops: int) -> Any:
    """``mod`` whose ``main`` takes one more input after the model's own, ``fkq_gates: float32[ops]``, and
    computes each op in ``plans`` in int8 where its gate is 1 and in fp32 where it is 0 (both are built; the
    int8 one exactly as :func:`rewrite` writes it).  One build then measures any mix of the two
    (:mod:`forgekit.quantize.sensitivity`)."""
    import tvm
    from tvm import relax

    gates = relax.Var("fkq_gates", relax.TensorType((ops,), "float32"))
    func = _rewriter_class()(mod, plans, gates).visit_expr(mod["main"])
    n_in = int(func.attrs["num_input"]) if func.attrs is not None and "num_input" in func.attrs else len(func.params)
    params = [*func.params[:n_in], gates, *func.params[n_in:]]
    func = relax.Function(params, func.body, func.ret_ty, func.is_pure, func.attrs)
    if func.attrs is not None and "num_input" in func.attrs:
        func = func.with_attr("num_input", n_in + 1)
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    out["main"] = func
    return relax.transform.Normalize()(out)
