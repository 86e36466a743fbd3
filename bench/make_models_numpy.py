"""ResNet-18 and MobileNetV2 (ImageNet shapes, seeded He-scaled random weights, batch-norm already
folded into conv biases) written with onnx.helper, for machines without torch (make_models.py needs it).
MobileNetV2 and the graph builder are forgekit.testing.zoo's (the zoo has ResNet-50, a detector, OCR and a
BERT-style encoder too).

    .venv/bin/python bench/make_models_numpy.py      # writes bench/models/resnet18.onnx, mobilenetv2.onnx
"""

from __future__ import annotations

import os

import onnx

from forgekit.testing.zoo_cnn import Net, mobilenetv2, resnet18_features

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


def resnet18() -> onnx.ModelProto:
    net = Net(18)
    x = resnet18_features(net)
    net.head(x, 512)
    return net.model("logits", "resnet18")


__all__ = ["mobilenetv2", "resnet18"]

if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, fn in (("resnet18", resnet18), ("mobilenetv2", mobilenetv2)):
        onnx.save(fn(), os.path.join(OUT, f"{name}.onnx"))
        print(f"wrote {os.path.join(OUT, name + '.onnx')}")
