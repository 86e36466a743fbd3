"""Batch-norm folding: inference batch-norms folded into the preceding convolution's weights and bias."""

from __future__ import annotations

from typing import Any


def has_op(mod: Any, op_name: str) -> bool:
    """Whether any Relax function of ``mod`` calls the operator ``op_name`` (e.g. ``relax.nn.conv2d``)."""
    import tvm
    from tvm import relax

    found = []

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == op_name:
            found.append(expr)

    for _gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def fold_batch_norms(mod: Any) -> Any:
    """Fold inference batch-norms into the preceding convolution (2-D or 1-D): ``conv(x, W) [+ b] → bn`` becomes
    ``conv(x, W * s) + ((b - mean) * s + beta)`` with ``s = gamma / sqrt(var + eps)``.

    TVM's ``FoldBatchnormToConv2D`` only matches a batch-norm directly after the convolution, but ONNX
    exporters put the convolution bias in between, so forgekit folds with its own pattern (in float64,
    on constants only, NCHW/OIHW and NCW/OIW only).  Unmatched batch-norms are decomposed at build time.
    """
    import numpy as np
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, is_tuple_get_item, rewrite_call, wildcard

    data, weight, bias = wildcard(), is_const(), is_const()
    gamma, beta, mean, var = is_const(), is_const(), is_const(), is_const()
    conv = is_op("relax.nn.conv2d")(data, weight) | is_op("relax.nn.conv1d")(data, weight)
    norm = is_op("relax.nn.batch_norm")(is_op("relax.add")(conv, bias) | conv, gamma, beta, mean, var)
    pattern = is_tuple_get_item(norm, 0)

    def rewrite(expr: Any, matched: Any) -> Any:
        call, bn = matched[conv], matched[norm]
        attrs, bn_attrs = call.attrs, bn.attrs
        if (attrs.data_layout not in ("NCHW", "NCW") or attrs.kernel_layout not in ("OIHW", "OIW")
                or int(bn_attrs.axis) != 1):
            return expr
        w = matched[weight].value.numpy()
        unit = (1,) * (w.ndim - 2)  # the spatial axes: 2 for conv2d, 1 for conv1d
        channels = w.shape[0]
        b = matched[bias].value.numpy() if bias in matched else np.zeros(channels, w.dtype)
        if b.size != channels:
            return expr
        g, bt, mu, v = (matched[p].value.numpy().astype(np.float64) for p in (gamma, beta, mean, var))
        scale = g / np.sqrt(v + float(bn_attrs.epsilon))
        new_w = (w.astype(np.float64) * scale.reshape(-1, 1, *unit)).astype(w.dtype)
        new_b = ((b.reshape(-1).astype(np.float64) - mu) * scale + bt).astype(w.dtype).reshape(1, -1, *unit)
        op = relax.op.nn.conv2d if w.ndim == 4 else relax.op.nn.conv1d
        folded = op(call.args[0], relax.const(new_w), strides=attrs.strides, padding=attrs.padding,
                    dilation=attrs.dilation, groups=attrs.groups, data_layout=attrs.data_layout,
                    kernel_layout=attrs.kernel_layout, out_layout=attrs.out_layout, out_dtype=attrs.out_dtype)
        return relax.op.add(folded, relax.const(new_b))

    if not has_op(mod, "relax.nn.batch_norm"):
        return mod
    import tvm

    functions = {gv: rewrite_call(pattern, rewrite, func) if isinstance(func, relax.Function) else func
                 for gv, func in mod.functions.items()}
    return tvm.IRModule(functions, attrs=mod.attrs)  # a new module: callers keep theirs unchanged


def fold_batch_norms_pass() -> Any:
    """:func:`fold_batch_norms` as a module pass."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="forgekit.FoldBatchNorm")
    def fold(mod: Any, _ctx: Any) -> Any:
        return fold_batch_norms(mod)

    return fold
