"""Models with control flow are fused like any other (forgekit/importer/dataflow.py).

The frontend leaves every binding of a graph holding an ``If`` (or a Loop) outside dataflow blocks, and FuseOps
fuses inside dataflow blocks only: openWakeWord's "hey jarvis" classifier (MLPs, then an ``If`` on a score) ran
its ~60 operators as ~60 kernels, each with an allocation.  The class: every graph with a runtime ``If`` or
``Loop`` (score gates, voice-activity detectors' sample-rate branch, decoders' Loops); the operators before it,
inside its branches and in Loop bodies.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import assert_close, ort_run
from test_backends_cpu import _model


def _mlp_nodes(prefix: str, src: str, out: str) -> list:
    return [helper.make_node("MatMul", [src, f"{prefix}w"], [f"{prefix}m"]),
            helper.make_node("Add", [f"{prefix}m", f"{prefix}b"], [f"{prefix}a"]),
            helper.make_node("Relu", [f"{prefix}a"], [out])]


def _gated_model():
    """y = relu(x @ w + b); if sum(y) > 0: sigmoid(relu(y @ w2 + b2)) else: y * 2 (a runtime If, an MLP in a branch)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((32, 32)) * 0.2).astype(np.float32), n) for n in ("w", "tw")]
    inits += [numpy_helper.from_array(rng.standard_normal(32).astype(np.float32) * 0.1, n) for n in ("b", "tb")]
    inits.append(numpy_helper.from_array(np.float32(2.0), "two"))
    then = helper.make_graph(_mlp_nodes("t", "y", "h") + [helper.make_node("Sigmoid", ["h"], ["r"])], "then", [],
                             [helper.make_tensor_value_info("r", TensorProto.FLOAT, [4, 32])])
    other = helper.make_graph([helper.make_node("Mul", ["y", "two"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4, 32])])
    nodes = _mlp_nodes("", "x", "y") + [
        helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other)]
    inits.append(numpy_helper.from_array(np.float32(0.0), "zero"))
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)


def test_operators_around_and_inside_an_if_are_fused() -> None:
    """Before: matmul, add and relu as 3 kernels before the If and 3 more in its branch; now one fused kernel
    each (the matmul's epilogue), and both branches still match onnxruntime."""
    from forgekit.backends import cpu

    model = _gated_model()
    cpu.STATS.clear()
    run = forge.from_onnx(model).get_inference_function("host", opt_level=3)
    kernels = sorted(cpu.STATS)
    fused = [k for k in kernels if "matmul" in k and "add" in k and "relu" in k]
    assert len(fused) >= 1 and not any(k.startswith(("add", "relu")) for k in kernels), kernels
    for sign in (1.0, -1.0):  # a positive sum takes the then branch; all-zero relu output (sum 0) the else one
        x = np.abs(np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)) * sign * 3
        assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])


def test_a_model_without_control_flow_is_left_as_imported() -> None:
    """The frontend's one dataflow block is already there: the module is returned as it came."""
    from forgekit.importer.dataflow import dataflow_around_control_flow

    nodes = _mlp_nodes("", "x", "y")
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    mod = forge.from_onnx(model).mod
    assert dataflow_around_control_flow(mod) is mod
