"""ResNet-18 and MobileNetV2 (ImageNet shapes, seeded He-scaled random weights, batch-norm already
folded into conv biases) written with onnx.helper, for machines without torch (make_models.py needs it).
MobileNetV2 and the graph builder are forgekit.testing.zoo's (the zoo has ResNet-50, a detector, OCR and a
BERT-style encoder too).

    .venv/bin/python bench/make_models_numpy.py      # writes bench/models/resnet18.onnx, mobilenetv2.onnx
"""

from __future__ import annotations

import os

import onnx

from forgekit.testing.zoo_cnn import Net, mobilenetv2

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


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


__all__ = ["mobilenetv2", "resnet18"]

if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, fn in (("resnet18", resnet18), ("mobilenetv2", mobilenetv2)):
        onnx.save(fn(), os.path.join(OUT, f"{name}.onnx"))
        print(f"wrote {os.path.join(OUT, name + '.onnx')}")
