"""Conv padding <-> relax.nn.pad widths (forgekit/passes/padding.py), against what the ops compute: a pad then an
unpadded conv equals the padded conv, in every layout the passes meet."""

from __future__ import annotations

import numpy as np
import pytest

from forgekit.passes.padding import conv_padding, pad_widths


@pytest.mark.parametrize("layout, padding, widths", [
    ("NCHW", [1, 2, 3, 4], [0, 0, 0, 0, 1, 3, 2, 4]),
    ("NHWC", [1, 2, 3, 4], [0, 0, 1, 3, 2, 4, 0, 0]),
    ("NCW", [0, 5], [0, 0, 0, 0, 0, 5]),
    ("NCDHW", [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 1, 4, 2, 5, 3, 6]),
])
def test_widths_and_padding_are_inverse(layout, padding, widths) -> None:
    assert pad_widths(layout, padding) == widths
    assert conv_padding(layout, widths) == padding


def test_a_pad_of_the_batch_or_channel_axis_is_no_conv_padding() -> None:
    assert conv_padding("NCHW", [0, 0, 1, 0, 1, 1, 1, 1]) is None
    assert conv_padding("NHWC", [0, 0, 1, 1, 1, 1, 0, 1]) is None
    assert conv_padding("NCHW", [0, 0, 1, 1]) is None  # widths of another rank
    with pytest.raises(ValueError):
        pad_widths("NCHW", [1, 1])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pad_then_conv_is_the_padded_conv(layout) -> None:
    import tvm
    from tvm import relax

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 7, 6) if layout == "NCHW" else (1, 7, 6, 3)).astype("float32")
    w = rng.standard_normal((4, 3, 3, 3)).astype("float32")
    padding = [1, 0, 2, 1]
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        conv = dict(data_layout=layout, kernel_layout="OIHW")
        a = bb.emit(relax.op.nn.conv2d(xv, relax.const(w), padding=padding, **conv))
        p = bb.emit(relax.op.nn.pad(xv, pad_widths(layout, padding)))
        b = bb.emit(relax.op.nn.conv2d(p, relax.const(w), padding=[0, 0, 0, 0], **conv))
        bb.emit_func_output(relax.Tuple([a, b]))
    ex = tvm.compile(bb.get(), target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    np.testing.assert_allclose(out[0].numpy(), out[1].numpy(), rtol=1e-5, atol=1e-5)
