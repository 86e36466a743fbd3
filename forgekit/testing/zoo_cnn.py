"""Convolutional zoo models (ResNet-50, MobileNetV2, a YOLOv8n-style detector) written with onnx.helper and
numpy: ImageNet/COCO-export shapes and op mixes, seeded He-scaled random weights (no torch, no downloads).

:class:`Net` is the small graph builder they share (``bench/make_models_numpy.py`` builds ResNet-18 with it)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Net:
    """Appends nodes and initializers; every call returns the name of the tensor it produced."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0
        self.scales: dict[str, float] = {}  # conv output -> its spread on an example input (calibrate)

    def _name(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def const(self, value: np.ndarray, kind: str = "c") -> str:
        name = self._name(kind)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, kind: str, inputs: list[str], **attrs) -> str:
        y = self._name(kind.lower())
        self.nodes.append(helper.make_node(kind, inputs, [y], **attrs))
        return y

    def ops(self, kind: str, inputs: list[str], n: int, **attrs) -> list[str]:
        ys = [self._name(kind.lower()) for _ in range(n)]
        self.nodes.append(helper.make_node(kind, inputs, ys, **attrs))
        return ys

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: str | None = "relu",
             bn: bool = False, gamma: float = 1.0, gain: float | None = None, bias: float = 0.0) -> str:
        """Conv (+ BatchNormalization kept as a node when ``bn``) + activation (relu, relu6, silu or None).

        Weights are N(0, gain / fan_in) (He: gain 2).  The random draws come in the same order as before BN
        existed (weight, bias), so models built without ``bn`` keep their weights."""
        gain = 2.0 if gain is None else gain
        w = (self.rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(gain / (cin // groups * k * k))).astype(np.float32)
        b = (self.rng.standard_normal(cout) * 0.05 + bias).astype(np.float32)
        wn, y = self._name("w"), self._name("conv")
        self.inits.append(numpy_helper.from_array(w, wn))
        inputs = [x, wn]
        if not bn:  # a trained conv feeding BN has no bias of its own (torchvision's bias=False)
            inputs.append(self.const(b, "b"))
        self.nodes.append(helper.make_node("Conv", inputs, [y], kernel_shape=[k, k], strides=[stride, stride],
                                           pads=[k // 2] * 4, group=groups))
        if bn:
            # Running statistics that are not the identity, so the importer's BN folding does real work;
            # ``gamma`` < 1 on a residual branch keeps 16 residual adds from blowing the activations up.
            scale = (self.rng.uniform(0.5, 1.0, cout) * gamma).astype(np.float32)
            stats = [scale, (self.rng.standard_normal(cout) * 0.1).astype(np.float32),
                     (self.rng.standard_normal(cout) * 0.1).astype(np.float32),
                     self.rng.uniform(0.5, 1.5, cout).astype(np.float32)]
            y = self.op("BatchNormalization", [y, *(self.const(s, "bn") for s in stats)], epsilon=1e-5)
        if act == "relu":
            return self.op("Relu", [y])
        if act == "relu6":
            r, lo, hi = self._name("relu6"), self._name("lo"), self._name("hi")
            self.inits += [numpy_helper.from_array(np.float32(0), lo), numpy_helper.from_array(np.float32(6), hi)]
            self.nodes.append(helper.make_node("Clip", [y, lo, hi], [r]))
            return r
        if act == "silu":
            return self.op("Mul", [y, self.op("Sigmoid", [y])])
        return y

    def head(self, x: str, cin: int) -> str:
        f = self.op("Flatten", [self.op("GlobalAveragePool", [x])])
        w = (self.rng.standard_normal((1000, cin)) * np.sqrt(1.0 / cin)).astype(np.float32)
        self.inits += [numpy_helper.from_array(w, "fc_w"), numpy_helper.from_array(np.zeros(1000, np.float32), "fc_b")]
        return self.op("Gemm", [f, "fc_w", "fc_b"], transB=1)

    def finish(self, name: str, inputs: dict[str, list[int]], outputs: dict[str, list[int]]) -> onnx.ModelProto:
        """The model, with the last node's output renamed to the (single) graph output."""
        self.nodes[-1].output[0] = next(iter(outputs))
        g = helper.make_graph(self.nodes, name,
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in outputs.items()],
                              self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m

    def model(self, out: str, name: str, batch: int = 1) -> onnx.ModelProto:
        """An ImageNet classifier's graph: input [batch,3,224,224] -> logits [batch,1000]."""
        return self.finish(name, {"input": [batch, 3, 224, 224]}, {out: [batch, 1000]})


def text_image(rng: np.random.Generator, shape: list[int]) -> np.ndarray:
    """A page in [0, 1): light paper with lines of dark strokes.  Uniform noise would do for a classifier,
    but makes PP-OCR's detector output an all-but-zero map (1e-5 everywhere) that no comparison can judge."""
    n, c, h, w = shape
    img = (0.8 + 0.15 * rng.random((n, 1, h, w))).astype(np.float32)
    for b in range(n):
        for _ in range(max(1, h // 40)):
            top, height = int(rng.integers(0, max(1, h - h // 8))), max(4, min(h // 2, int(rng.integers(12, 32))))
            x = int(rng.integers(0, w // 4))
            while x < w - 4 and rng.random() > 0.02:
                width = int(rng.integers(2, 5))
                img[b, 0, top:top + height, x:x + width] = 0.1 * rng.random()
                x += width + int(rng.integers(2, 8)) + (int(rng.integers(8, 20)) if rng.random() < 0.1 else 0)
    return np.repeat(img, c, 1)


def calibrate(model: onnx.ModelProto, scales: dict[str, float]) -> None:
    """Scale every Conv's weights, in graph order, so that its output spreads (std) 1 on an example image,
    or ``scales[out]``: what a trained network's batch norms do (LSUV).  Random He weights alone shrank a
    30-layer SiLU detector's head to noise around a constant (the DFL softmax uniform, every class score
    0.50+-0.02), so its output hardly depended on the network; a larger SiLU gain blew it up (std 500)."""
    import onnxruntime

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    convs = [n for n in graph.node if n.op_type == "Conv" and n.input[1] in weights]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)  # the weights as inputs: one session, each conv's output computed on demand
    names = {n.input[1] for n in convs}
    kept = [t for t in probe.graph.initializer if t.name not in names]
    del probe.graph.initializer[:]
    probe.graph.initializer.extend(kept)
    probe.graph.input.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, list(weights[n].dims)) for n in names)
    probe.graph.output.extend(onnx.ValueInfoProto(name=n.output[0]) for n in convs)
    session = onnxruntime.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    image = text_image(np.random.default_rng(1), [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim])
    feeds = {graph.input[0].name: image, **{n: numpy_helper.to_array(weights[n]) for n in names}}
    for node in convs:
        out = session.run([node.output[0]], feeds)[0]
        feeds[node.input[1]] = feeds[node.input[1]] * np.float32(scales.get(node.output[0], 1.0) / max(float(out.std()), 1e-6))
    for n in names:
        weights[n].CopyFrom(numpy_helper.from_array(feeds[n], n))


def resnet18_features(net: Net) -> str:
    """ResNet-18's stem and its 8 basic blocks (64-512 channels) on ``net``'s "input": the last feature map
    (512 channels), for a head to finish (bench/make_models_numpy.py, bench/bench_contention.py)."""
    x = net.op("MaxPool", [net.conv("input", 3, 64, 7, 2)], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            s = stride if block == 0 else 1
            y = net.conv(net.conv(x, cin, cout, 3, s), cout, cout, 3, 1, act=None)
            short = net.conv(x, cin, cout, 1, s, act=None) if (s != 1 or cin != cout) else x
            x = net.op("Relu", [net.op("Add", [y, short])])
            cin = cout
    return x


def resnet50(batch: int = 1) -> onnx.ModelProto:
    """torchvision's ResNet-50 v1.5 layout (stride in the 3x3 conv), BatchNormalization nodes kept."""
    net = Net(50)
    x = net.conv("input", 3, 64, 7, 2, bn=True)
    x = net.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            s = stride if block == 0 else 1
            y = net.conv(x, cin, width, 1, bn=True)
            y = net.conv(y, width, width, 3, s, bn=True)
            y = net.conv(y, width, width * 4, 1, act=None, bn=True, gamma=0.3)
            short = net.conv(x, cin, width * 4, 1, s, act=None, bn=True) if block == 0 else x
            x = net.op("Relu", [net.op("Add", [y, short])])
            cin = width * 4
    net.head(x, 2048)
    return net.model("logits", "resnet50", batch)


def mobilenetv2(batch: int = 1) -> onnx.ModelProto:
    """MobileNetV2 1.0 (inverted residuals, depthwise 3x3, ReLU6 as Clip), BN folded into conv biases."""
    net = Net(2)
    x, cin = net.conv("input", 3, 32, 3, 2, act="relu6"), 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = net.conv(x, cin, hidden, 1, act="relu6") if t != 1 else x
            y = net.conv(y, hidden, hidden, 3, stride, groups=hidden, act="relu6")
            y = net.conv(y, hidden, c, 1, act=None)
            x = net.op("Add", [x, y]) if stride == 1 and cin == c else y
            cin = c
    net.head(net.conv(x, cin, 1280, 1, act="relu6"), 1280)
    return net.model("logits", "mobilenetv2", batch)


# ---------------------------------------------------------------- YOLOv8n-style (bench/yolo_style.py in torch)
def _c2f(net: Net, x: str, cin: int, cout: int, n: int, shortcut: bool) -> str:
    c = cout // 2
    y = net.ops("Split", [net.conv(x, cin, 2 * c, 1, act="silu"), net.const(np.array([c, c], np.int64), "split")], 2, axis=1)
    for _ in range(n):
        b = net.conv(net.conv(y[-1], c, c, 3, act="silu"), c, c, 3, act="silu")
        y.append(net.op("Add", [y[-1], b]) if shortcut else b)
    return net.conv(net.op("Concat", y, axis=1), (2 + n) * c, cout, 1, act="silu")


def _sppf(net: Net, x: str, cin: int, cout: int) -> str:
    y = [net.conv(x, cin, cin // 2, 1, act="silu")]
    for _ in range(3):
        y.append(net.op("MaxPool", [y[-1]], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]))
    return net.conv(net.op("Concat", y, axis=1), cin * 2, cout, 1, act="silu")


def _detect(net: Net, feats: list[tuple[str, int, int]], batch: int, nc: int = 80, reg_max: int = 16) -> str:
    """Decoupled head + DFL (softmax over 16 bins, a fixed 1x1 conv with arange weights) + boxes in pixels."""
    c2, c3 = max(16, feats[0][1] // 4, reg_max * 4), max(feats[0][1], min(nc, 100))
    outs, anchors, strides = [], [], []
    for (x, ch, size), stride in zip(feats, (8, 16, 32)):
        box = net.conv(net.conv(net.conv(x, ch, c2, 3, act="silu"), c2, c2, 3, act="silu"), c2, 4 * reg_max, 1, act=None)
        cls = net.conv(net.conv(net.conv(x, ch, c3, 3, act="silu"), c3, c3, 3, act="silu"), c3, nc, 1, act=None, bias=-4.0)
        net.scales[box], net.scales[cls] = 3.0, 2.0
        shape = net.const(np.array([batch, 4 * reg_max + nc, -1], np.int64), "shape")
        outs.append(net.op("Reshape", [net.op("Concat", [box, cls], axis=1), shape]))
        sy, sx = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="ij")
        anchors.append(np.stack((sx.ravel(), sy.ravel())))
        strides.append(np.full(size * size, float(stride)))
    a = sum(s.size for s in strides)
    box, cls = net.ops("Split", [net.op("Concat", outs, axis=2), net.const(np.array([4 * reg_max, nc], np.int64), "split")],
                       2, axis=1)
    bins = net.op("Reshape", [box, net.const(np.array([batch, 4, reg_max, a], np.int64), "shape")])
    prob = net.op("Softmax", [net.op("Transpose", [bins], perm=[0, 2, 1, 3])], axis=1)
    arange = net.const(np.arange(reg_max, dtype=np.float32).reshape(1, reg_max, 1, 1), "dfl")
    dist = net.op("Reshape", [net.op("Conv", [prob, arange]), net.const(np.array([batch, 4, a], np.int64), "shape")])
    lt, rb = net.ops("Split", [dist, net.const(np.array([2, 2], np.int64), "split")], 2, axis=1)
    anchor = net.const(np.concatenate(anchors, 1)[None].astype(np.float32), "anchors")
    x1y1, x2y2 = net.op("Sub", [anchor, lt]), net.op("Add", [anchor, rb])
    centre = net.op("Div", [net.op("Add", [x1y1, x2y2]), net.const(np.array(2, np.float32))])
    wh = net.op("Sub", [x2y2, x1y1])
    boxes = net.op("Mul", [net.op("Concat", [centre, wh], axis=1),
                           net.const(np.concatenate(strides)[None].astype(np.float32), "strides")])
    return net.op("Concat", [boxes, net.op("Sigmoid", [cls])], axis=1)


def yolov8_style(batch: int = 1, size: int = 320) -> onnx.ModelProto:
    """YOLOv8n's layout (widths 16-32-64-128-256, 3.2 M parameters) as ultralytics exports it: BN folded into
    conv biases, SiLU as x*Sigmoid(x).  Output [batch, 84, 2100] at 320x320 (4 box coordinates, 80 classes)."""
    net = Net(8)
    x = net.conv(net.conv("images", 3, 16, 3, 2, act="silu"), 16, 32, 3, 2, act="silu")
    x = _c2f(net, x, 32, 32, 1, True)
    p3 = _c2f(net, net.conv(x, 32, 64, 3, 2, act="silu"), 64, 64, 2, True)
    p4 = _c2f(net, net.conv(p3, 64, 128, 3, 2, act="silu"), 128, 128, 2, True)
    p5 = _c2f(net, net.conv(p4, 128, 256, 3, 2, act="silu"), 256, 256, 1, True)
    p5 = _sppf(net, p5, 256, 256)
    scales = net.const(np.array([1, 1, 2, 2], np.float32), "scales")

    def up(t: str) -> str:
        return net.op("Resize", [t, "", scales], mode="nearest")

    n4 = _c2f(net, net.op("Concat", [up(p5), p4], axis=1), 384, 128, 1, False)
    o3 = _c2f(net, net.op("Concat", [up(n4), p3], axis=1), 192, 64, 1, False)
    o4 = _c2f(net, net.op("Concat", [net.conv(o3, 64, 64, 3, 2, act="silu"), n4], axis=1), 192, 128, 1, False)
    o5 = _c2f(net, net.op("Concat", [net.conv(o4, 128, 128, 3, 2, act="silu"), p5], axis=1), 384, 256, 1, False)
    _detect(net, [(o3, 64, size // 8), (o4, 128, size // 16), (o5, 256, size // 32)], batch)
    anchors = sum((size // s) ** 2 for s in (8, 16, 32))
    model = net.finish("yolov8_style", {"images": [batch, 3, size, size]}, {"output0": [batch, 84, anchors]})
    # Trained heads have peaked bin logits (a box side is a few bins, not the mean of 16: std 3) and mostly
    # negative class logits (ultralytics starts the class bias near -4.6: std 2 around -4, a few detections).
    calibrate(model, net.scales)
    return model
