"""Parallel loop nests of symbolic size get a serial twin for small calls
(forgekit/backends/cpu/serial_when_small.py), and the zero-padded copy feeding a dynamic matmul is
vectorized (rules/common.parallel_spatial).

A fork/join costs ~6 us here: at S=16 a dynamic BERT-style encoder's transposes and attention matmuls
spent more time launching threads than computing (1.48x its static twin; 1.15x with the twin).  Both
branches must compute the same thing: checked against onnxruntime at sizes below and above the
thresholds, and the twin must keep each copy's accumulator its own (sharing it kept the matmul's
accumulator in memory: 3x slower)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import forgekit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run, scheduled_kernels  # noqa: E402
from onnx_models import attention_block  # noqa: E402


def test_dynamic_kernels_carry_a_serial_twin_with_their_own_buffers() -> None:
    import tvm

    mod, _ = scheduled_kernels(attention_block(), {"x": [1, "S", 32]})
    texts = {gv.name_hint: f.script() for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    twinned = {name: text for name, text in texts.items() if "T.parallel(" in text and "\n    if " in text}
    assert twinned, sorted(texts)
    # the q @ k^T kernel: its serial copy allocates its own accumulator
    assert any("_serial = T.sblock_alloc_buffer" in text for text in twinned.values()), sorted(twinned)


@pytest.mark.parametrize("length", [1, 16, 77, 300])
def test_both_branches_match_onnxruntime(length: int) -> None:
    model = attention_block()
    _, run = scheduled_kernels(model, {"x": [1, "S", 32]})
    x = np.random.default_rng(length).standard_normal((1, length, 32)).astype(np.float32)
    assert_close(run(x), ort_run(model, {"x": x})[0])


def test_a_size_that_is_never_small_gets_no_twin() -> None:
    """A dynamic batch of 64x64 feature maps is never below the threshold: a twin under ``N < 1`` would
    make TVM's lowering see ``N == 0`` and reject divisions by it (was: "Find divide by zero")."""
    from conftest import make_convnet

    model = make_convnet(batch="N")
    name = model.graph.input[0].name
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    _, run = scheduled_kernels(model, {name: ["N", *dims[1:]]})
    x = np.random.default_rng(0).standard_normal((2, *dims[1:])).astype(np.float32)
    assert_close(run(x), ort_run(model, {name: x})[0])


def test_a_kernel_that_needs_a_minimum_size_compiles() -> None:
    """A valid 7-tap convolution over a dynamic number of frames has ``frames - 6`` output rows: the serial
    copy's condition must hold only for sizes the kernel takes (was: a twin under ``frames < 7``, where TVM's
    lowering saw an empty extent and stopped with "Find divide by zero"; PLCMOS v2 from PyPI)."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((128, 64, 7, 3)).astype(np.float32) * 0.05,
                                "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[0, 1, 0, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, "F", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _, run = scheduled_kernels(model, {"x": [1, 64, "F", 16]})
    for frames in (7, 9, 300):
        x = np.random.default_rng(frames).standard_normal((1, 64, frames, 16)).astype(np.float32)
        assert_close(run(x), ort_run(model, {"x": x})[0])
