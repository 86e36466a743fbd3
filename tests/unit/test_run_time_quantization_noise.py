"""``verify`` on models that quantize at run time (onnxruntime's dynamic quantization, issue 39 point 4).

Such a model rounds each tensor to steps of 1/255 of its own range; a value within an ulp of a rounding
boundary goes either way, and through a chain of quantized layers the flipped step grows.  forgekit computes
the same integers (tests/unit/test_dynamic_quantize_lstm.py), yet ddddocr's quantized recognizer came out
0.07-0.18 from onnxruntime (of 16) where onnxruntime differs from itself by 0.09-0.41 with its inputs one ulp
apart: ``verify`` takes that sensitivity as the reference's noise (``reference.perturbation_noise``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from forgekit.evaluate import reference


def _dql_model(path: Path, in_if: bool = False) -> Path:
    """y = DynamicQuantizeLinear(x) dequantized (optionally inside an If branch)."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])]
    if in_if:
        branch = helper.make_graph(nodes, "b", [], out)
        nodes = [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True])),
                 helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])], out)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_run_time_quantization_is_found_in_subgraphs_too(tmp_path: Path) -> None:
    assert reference.quantizes_at_run_time(_dql_model(tmp_path / "a.onnx"))
    assert reference.quantizes_at_run_time(_dql_model(tmp_path / "b.onnx", in_if=True))
    plain = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])])
    onnx.save(helper.make_model(plain, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "c.onnx")
    assert not reference.quantizes_at_run_time(tmp_path / "c.onnx")


def test_a_value_on_a_rounding_boundary_gives_one_step_of_noise(tmp_path: Path) -> None:
    """Range [0, 2.55], one step 0.01: a value near a half step rounds to the step below or above with its last
    bits, so a nudge moves its output by a whole step; away from half steps the nudges move the
    outputs by float rounding only (the range itself moves by an ulp)."""
    path = _dql_model(tmp_path / "m.onnx")
    sess = reference.session(path)
    base = np.linspace(0.1, 2.55, 8).astype(np.float32)
    far = {"x": base}
    assert reference.perturbation_noise(path, far, reference.run(sess, far))[0] < 1e-4  # 16 ulps of the range
    scale = np.float32(2.55) / np.float32(255)
    for k in range(1, 200):  # find a value whose quantization flips within one ulp, as any chain meets now and then
        x = base.copy()
        x[0] = np.float32((k + 0.5) * scale)
        fed = {"x": x}
        noise = reference.perturbation_noise(path, fed, reference.run(sess, fed))[0]
        if noise > scale / 2:  # a flipped step (the range moving by an ulp moves outputs by ~1e-7)
            assert abs(noise - scale) < 1e-5
            return
    raise AssertionError("no value on a rounding boundary found")


def _embedding_model(path: Path, table: np.ndarray) -> Path:
    """y = DynamicQuantizeLinear(table[ids]) dequantized: a model fed token ids, no float."""
    from onnx import numpy_helper

    nodes = [helper.make_node("Gather", ["table", "ids"], ["x"], axis=0),
             helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(table, "table")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_model_fed_token_ids_moves_its_float_weights() -> None:
    """No float input to nudge (a T5 encoder takes ids): the float initializers move instead, and a table
    value on a rounding boundary gives one step of noise (was 0: every difference then failed verify,
    exit 13, on a quantize_dynamic T5 encoder that onnxruntime itself moves by 0.15-0.21)."""
    import tempfile

    scale = np.float32(2.55) / np.float32(255)
    fed = {"ids": np.array([0], np.int64)}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(1, 200):
            table = np.tile(np.linspace(0.1, 2.55, 8, dtype=np.float32), (4, 1))
            table[0, 0] = np.float32((k + 0.5) * scale)
            path = _embedding_model(Path(tmp) / f"m{k}.onnx", table)
            noise = reference.perturbation_noise(path, fed, reference.run(reference.session(path), fed))[0]
            if noise > scale / 2:
                assert abs(noise - scale) < 1e-5
                return
    raise AssertionError("no table value on a rounding boundary flipped when the weights moved")
