"""Transposed convolutions whose stride equals their kernel (the 2x2/stride-2 upsampling of U-Net, DB and
FPN heads) become a 1x1 convolution and a depth-to-space shuffle.

With ``stride == kernel``, no padding, no dilation and one group, each output pixel receives exactly one
contribution: ``y[n, o, h*kh + i, w*kw + j] = sum_c x[n, c, h, w] * W[c, o, i, j]``.  That is a 1x1
convolution to ``Cout*kh*kw`` channels (channel ``o*kh*kw + i*kw + j``), then a reshape/transpose.  The
1x1 convolution runs on forgekit's tiled conv/matmul micro-kernel in NHWC; TVM 0.27 legalizes
``conv2d_transpose`` only in NCHW and forgekit has no rule for it, so it ran as TVM's unscheduled loop nest:
PP-OCRv4 det's two 2x2/stride-2 heads took 22 % of the model's time (instrumented VM, 2 threads).

Why not a library pass: TVM has no such rewrite (its ``conv2d_transpose`` strategy lives in the removed
Relay TOPI schedules), and onnxscript's/onnxslim's optimizers keep ConvTranspose as it is.
"""

from __future__ import annotations

from typing import Any

from .batchnorm import has_op


def conv_transpose_as_conv(mod: Any) -> Any:
    """Rewrite every eligible ``relax.nn.conv2d_transpose`` (constant IOHW weights, NCHW data) of ``mod``."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    data, weight = wildcard(), is_const()
    pattern = is_op("relax.nn.conv2d_transpose")(data, weight)

    def rewrite(expr: Any, matched: Any) -> Any:
        call = matched[pattern]
        attrs = call.attrs
        w = matched[weight].value.numpy()
        x = matched[data]
        shape = getattr(x.ty, "shape", None)
        if (w.ndim != 4 or attrs.data_layout != "NCHW" or attrs.kernel_layout != "IOHW"
                or attrs.out_layout not in ("", "NCHW") or int(attrs.groups) != 1
                or [int(s) for s in attrs.strides] != list(w.shape[2:])
                or any(int(p) for p in attrs.padding) or any(int(p) for p in attrs.output_padding)
                or any(int(d) != 1 for d in attrs.dilation) or shape is None or len(shape) != 4
                or (attrs.out_dtype and str(attrs.out_dtype) not in ("", str(w.dtype)))):
            return expr
        cin, cout, kh, kw = w.shape
        n, _, h, width = shape.values
        # OIHW 1x1 weights; output channel o*kh*kw + i*kw + j holds W[:, o, i, j]
        w1 = w.reshape(cin, cout * kh * kw).T.reshape(cout * kh * kw, cin, 1, 1).copy()
        y = relax.op.nn.conv2d(x, relax.const(w1), strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1,
                               data_layout="NCHW", kernel_layout="OIHW")
        y = relax.op.reshape(y, [n, cout, kh, kw, h, width])
        y = relax.op.permute_dims(y, [0, 1, 4, 2, 5, 3])  # n, o, h, i, w, j
        return relax.op.reshape(y, [n, cout, h * kh, width * kw])

    if not has_op(mod, "relax.nn.conv2d_transpose"):
        return mod
    functions = {gv: rewrite_call(pattern, rewrite, func) if isinstance(func, relax.Function) else func
                 for gv, func in mod.functions.items()}
    return tvm.IRModule(functions, attrs=mod.attrs)


def conv_transpose_as_conv_pass() -> Any:
    """:func:`conv_transpose_as_conv` as a module pass."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="forgekit.ConvTransposeAsConv")
    def rewrite(mod: Any, _ctx: Any) -> Any:
        return conv_transpose_as_conv(mod)

    return rewrite
