"""Concatenations along the innermost (NHWC channel) axis: one vector copy per input (rules/elementwise.py),
equal to onnxruntime, and the other forms still scheduled the generic way."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import assert_close, ort_run
from test_backends_cpu import _model


def _branches(widths: list[int], relu_after: bool = False):
    """A squeeze conv feeding one conv per width, concatenated on channels (SqueezeNet's fire module when
    widths = [64, 64]); convs make the graph NHWC, so the concat is on the innermost axis."""
    rng = np.random.default_rng(sum(widths))
    inits = [numpy_helper.from_array((rng.standard_normal((16, 8, 1, 1)) * 0.3).astype(np.float32), "ws")]
    nodes = [helper.make_node("Conv", ["x", "ws"], ["s"]), helper.make_node("Relu", ["s"], ["sr"])]
    outs = []
    for i, width in enumerate(widths):
        k = 1 if i % 2 == 0 else 3
        inits.append(numpy_helper.from_array((rng.standard_normal((width, 16, k, k)) * 0.2).astype(np.float32),
                                             f"w{i}"))
        nodes.append(helper.make_node("Conv", ["sr", f"w{i}"], [f"c{i}"], pads=[k // 2] * 4))
        outs.append(f"c{i}")
    nodes.append(helper.make_node("Concat", outs, ["cat" if relu_after else "y"], axis=1))
    if relu_after:
        nodes.append(helper.make_node("Relu", ["cat"], ["y"]))
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


@pytest.mark.parametrize("widths,relu", [([64, 64], False), ([32, 48, 16], False), ([64, 64], True),
                                         ([24, 40], False), ([3, 5], False)])
def test_channel_concat_matches_onnxruntime(widths, relu) -> None:
    model = _branches(widths, relu)
    x = np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)
    got = forge.from_onnx(model).get_inference_function("host", opt_level=3)(x)
    assert_close(np.asarray(got), ort_run(model, {"x": x})[0])


def _concat_func(widths: list[int]):
    from tvm import te, topi

    parts = [te.placeholder((1, 6, 6, w), name=f"a{i}") for i, w in enumerate(widths)]
    out = topi.concatenate(parts, axis=3)
    return te.create_prim_func([*parts, out])


@pytest.mark.parametrize("widths,partitioned", [([64, 64], True), ([32, 48, 16], True), ([24, 40], False)])
def test_concat_loop_is_split_at_the_inputs_when_they_are_whole_vectors(widths, partitioned) -> None:
    import tvm
    from tvm import s_tir

    from forgekit.backends.cpu.rules.elementwise import ElementwiseRule
    from forgekit.targets.isa import isa_info

    isa = isa_info(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}))
    sch = s_tir.Schedule(_concat_func(widths))
    rule = ElementwiseRule()
    rule.apply(sch, rule.matches(sch, isa), isa)
    script = sch.mod.script()
    assert ("_partition" in script) == partitioned, script
    assert "T.vectorized" in script or not partitioned
