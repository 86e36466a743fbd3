"""``Pow(x, 2)`` and ``Pow(x, 3)`` are products, as onnxruntime computes them (forgekit/passes/canonicalize.py,
``_small_power``): TVM called libm's ``powf`` per element, 26 % of whose cubes differ from onnxruntime's
``x * x * x`` in the last bit, and slow enough to make a T5 encoder's tanh-GELU most of its FFN kernel."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit


def _power(exponent: float, dtype=np.float32):
    """y = Pow(x, exponent) * 0.5 + x over a dynamic length (the tanh-GELU's inner polynomial)."""
    nodes = [helper.make_node("Pow", ["x", "e"], ["p"]), helper.make_node("Mul", ["p", "h"], ["m"]),
             helper.make_node("Add", ["m", "x"], ["y"])]
    graph = helper.make_graph(nodes, "power", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "L"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(exponent, dtype), "e"),
                               numpy_helper.from_array(np.array(0.5, np.float32), "h")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("exponent,dtype", [(2.0, np.float32), (3.0, np.float32), (3, np.int64)])
@pytest.mark.parametrize("level", [0, 3])
def test_squares_and_cubes_match_onnxruntime_bit_for_bit(tmp_path, exponent, dtype, level: int) -> None:
    model = _power(exponent, dtype)
    result = forgekit.from_onnx(model).compile("host", output_path=tmp_path / "a", opt_level=level)
    engine = forgekit.Engine(result.path)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for length in (1000, 4099):
        x = np.random.default_rng(length).standard_normal((2, length)).astype(np.float32) * 3
        got = engine.infer({"x": x})
        got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
        np.testing.assert_array_equal(got, sess.run(None, {"x": x})[0])
    assert b"powf" not in (result.path / "model_library.so").read_bytes()


def test_other_exponents_stay_powers() -> None:
    """onnxruntime calls ``pow`` for them (x^4 by ``powf`` differs from ``(x * x) * (x * x)``)."""
    from tvm import relax

    mod = forgekit.from_onnx(_power(4.0)).mod
    ops = []
    relax.analysis.post_order_visit(mod["main"], lambda e: ops.append(e.op.name) if isinstance(e, relax.Call)
                                    and hasattr(e.op, "name") else None)
    assert "relax.power" in ops


def test_an_integer_exponent_given_at_run_time(tmp_path) -> None:
    """An int64 exponent input of a float base (was: "Binary operators must have the same datatype", exit 4)."""
    graph = helper.make_graph([helper.make_node("Pow", ["x", "e"], ["y"])], "power",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5]),
                               helper.make_tensor_value_info("e", TensorProto.INT64, [5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    engine = forgekit.Engine(forgekit.from_onnx(model).compile("host", output_path=tmp_path / "a").path)
    x = np.random.default_rng(0).uniform(0.5, 2.0, (3, 5)).astype(np.float32)
    e = np.array([0, 1, 2, 3, -1], np.int64)
    got = engine.infer({"x": x, "e": e})
    got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x, "e": e})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-6)
