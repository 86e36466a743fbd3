"""ResNet-18 and MobileNetV2 (ImageNet shapes, seeded He-scaled random weights, batch-norm already
folded into conv biases) written with onnx.helper, for machines without torch (make_models.py needs it).

    .venv/bin/python bench/make_models_numpy.py      # writes bench/models/resnet18.onnx, mobilenetv2.onnx
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


class Net:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def _name(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: str | None = "relu") -> str:
        w = (self.rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2.0 / (cin // groups * k * k))).astype(np.float32)
        b = (self.rng.standard_normal(cout) * 0.05).astype(np.float32)
        wn, bn, y = self._name("w"), self._name("b"), self._name("conv")
        self.inits += [numpy_helper.from_array(w, wn), numpy_helper.from_array(b, bn)]
        self.nodes.append(helper.make_node("Conv", [x, wn, bn], [y], kernel_shape=[k, k], strides=[stride, stride],
                                           pads=[k // 2] * 4, group=groups))
        if act == "relu":
            r = self._name("relu")
            self.nodes.append(helper.make_node("Relu", [y], [r]))
            return r
        if act == "relu6":
            r, lo, hi = self._name("relu6"), self._name("lo"), self._name("hi")
            self.inits += [numpy_helper.from_array(np.float32(0), lo), numpy_helper.from_array(np.float32(6), hi)]
            self.nodes.append(helper.make_node("Clip", [y, lo, hi], [r]))
            return r
        return y

    def op(self, kind: str, inputs: list[str], **attrs) -> str:
        y = self._name(kind.lower())
        self.nodes.append(helper.make_node(kind, inputs, [y], **attrs))
        return y

    def head(self, x: str, cin: int) -> str:
        f = self.op("Flatten", [self.op("GlobalAveragePool", [x])])
        w = (self.rng.standard_normal((1000, cin)) * np.sqrt(1.0 / cin)).astype(np.float32)
        self.inits += [numpy_helper.from_array(w, "fc_w"), numpy_helper.from_array(np.zeros(1000, np.float32), "fc_b")]
        return self.op("Gemm", [f, "fc_w", "fc_b"], transB=1)

    def model(self, out: str, name: str) -> onnx.ModelProto:
        self.nodes[-1].output[0] = "logits"
        g = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def resnet18() -> onnx.ModelProto:
    net = Net(18)
    x = net.op("MaxPool", [net.conv("input", 3, 64, 7, 2)], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            s = stride if block == 0 else 1
            y = net.conv(net.conv(x, cin, cout, 3, s), cout, cout, 3, 1, act=None)
            short = net.conv(x, cin, cout, 1, s, act=None) if (s != 1 or cin != cout) else x
            x = net.op("Relu", [net.op("Add", [y, short])])
            cin = cout
    net.head(x, 512)
    return net.model("logits", "resnet18")


def mobilenetv2() -> onnx.ModelProto:
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
    return net.model("logits", "mobilenetv2")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, fn in (("resnet18", resnet18), ("mobilenetv2", mobilenetv2)):
        onnx.save(fn(), os.path.join(OUT, f"{name}.onnx"))
        print(f"wrote {os.path.join(OUT, name + '.onnx')}")
