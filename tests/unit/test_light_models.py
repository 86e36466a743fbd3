"""The nine onnx-wheel "light" models compiled for this CPU, against their shipped reference outputs
and onnxruntime.

Inputs are what onnx's backend test runner feeds them (``arange(n)/n`` reshaped), so the shipped
``*_output_0.pb`` files apply.  Those weights are all ``ConstantOfShape(0.02)``, which makes outputs nearly
uniform; ``test_reseeded_*`` replaces them with random weights for a discriminating comparison.

Tolerance: rtol 1e-3 and atol 1e-5 (softmax outputs are ~1e-3), the onnx runner's own rtol.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import forgekit
from conftest import assert_close, ort_run
from forgekit.runtime import Engine
from forgekit.samples import NAMES, light_dir


def _dummy_input(model: onnx.ModelProto) -> tuple[str, np.ndarray]:
    inits = {i.name for i in model.graph.initializer}
    (vi,) = [i for i in model.graph.input if i.name not in inits]
    shape = tuple(d.dim_value or 1 for d in vi.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return vi.name, (np.arange(n).reshape(shape) / n).astype(np.float32)


def _compile_and_run(model, tmp_path, x):
    result = forgekit.from_onnx(model).compile(target="host", output_path=tmp_path / "art")
    return Engine(result.path).infer(x)


@pytest.mark.parametrize("name", NAMES)
def test_light_model_matches_reference_and_onnxruntime(name, tmp_path) -> None:
    path = light_dir() / f"light_{name}.onnx"
    model = onnx.load(path)
    input_name, x = _dummy_input(model)
    outputs = _compile_and_run(path, tmp_path, x)
    reference = numpy_helper.to_array(onnx.load_tensor(str(light_dir() / f"light_{name}_output_0.pb")))
    assert_close(outputs[0], reference, rtol=1e-3, atol=1e-5)
    assert_close(outputs[0], ort_run(path, {input_name: x})[0], rtol=1e-3, atol=1e-5)


def reseed(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Replace every ConstantOfShape weight with a random initializer (He-scaled; 1-D in [0.5, 1.5])."""
    rng = np.random.default_rng(seed)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    shapes = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    keep = []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            shape = tuple(int(d) for d in shapes[node.input[0]])
            if len(shape) > 1:
                fan_in = int(np.prod(shape[1:]))
                value = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
            else:  # biases and batch-norm statistics: positive so variances stay valid
                value = rng.uniform(0.5, 1.5, shape)
            model.graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_reseeded_light_model_matches_onnxruntime(name, tmp_path) -> None:
    model = reseed(onnx.load(light_dir() / f"light_{name}.onnx"), seed=7)
    input_name, _ = _dummy_input(model)
    x = np.random.default_rng(3).random((1, 3, 224, 224), dtype=np.float32)
    expected = ort_run(model, {input_name: x})[0]
    assert expected.std() > 1e-4  # discriminating: not the near-uniform output of the shipped weights
    outputs = _compile_and_run(model, tmp_path, x)
    assert_close(outputs[0], expected, rtol=1e-3, atol=1e-4)
    assert int(np.argmax(outputs[0])) == int(np.argmax(expected))
