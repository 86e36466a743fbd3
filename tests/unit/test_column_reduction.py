"""Reductions over a non-innermost axis (YOLOv8's DFL softmax, channel sums/maxes in NCHW): scheduled by
``ColumnReductionRule`` (the reduced axis outside a contiguous vector chunk) and equal to onnxruntime.

Before the rule, the DFL softmax ``[1, 16, 4, 2100]`` over axis 1 ran as a strided row reduction: 7.9 ms
alone, 0.11 ms with it (see the rule's docstring)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import assert_close, ort_run
from test_backends_cpu import _model


def _softmax(shape, axis):
    return _model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [])


def _reduce(op, shape, axes, keepdims):
    if op == "ReduceSum":  # opset 17: axes is an input of ReduceSum, an attribute of the others
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
        inits = [numpy_helper.from_array(np.array(axes, np.int64), "axes")]
    else:
        node, inits = helper.make_node(op, ["x"], ["y"], keepdims=keepdims, axes=axes), []
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def _exp_reduce(shape, axes):
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("ReduceSum", ["e", "axes"], ["y"], keepdims=1)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                  [numpy_helper.from_array(np.array(axes, np.int64), "axes")])


def _dfl(anchors: int):
    """YOLOv8's box decoding: [1, 64, A] -> 4 x 16-bin softmax -> expectation by a fixed 1x1 conv."""
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1), "w")
    nodes = [helper.make_node("Reshape", ["x", "s4"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Softmax", ["t"], ["p"], axis=1),
             helper.make_node("Conv", ["p", "w"], ["c"]),
             helper.make_node("Reshape", ["c", "s3"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, anchors])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                  [w, numpy_helper.from_array(np.array([1, 4, 16, anchors], np.int64), "s4"),
                   numpy_helper.from_array(np.array([1, 4, anchors], np.int64), "s3")])


CASES = {  # name: (model, whether the column rule must schedule it)
    "softmax axis 1, inner 70 (a tail chunk)": (lambda: _softmax([1, 16, 4, 70], 1), True),
    "softmax axis 1, batch 2, inner 300": (lambda: _softmax([2, 16, 4, 300], 1), True),
    "softmax axis 2 of 3-d": (lambda: _softmax([3, 10, 96], 1), True),
    # a reduction as the output is a pooling window to PoolRule (it runs first)
    "ReduceSum axis 1 keepdims": (lambda: _reduce("ReduceSum", [1, 16, 4, 100], [1], 1), None),
    "ReduceMax axes 1,2 keepdims": (lambda: _reduce("ReduceMax", [1, 8, 6, 64], [1, 2], 1), None),
    "Exp then ReduceSum axis 1 keepdims": (lambda: _exp_reduce([1, 16, 4, 100], [1]), None),
    "ReduceMean axis 1 keepdims=0": (lambda: _reduce("ReduceMean", [1, 8, 6, 64], [1], 0), False),
    "softmax last axis (a row)": (lambda: _softmax([4, 8, 64], -1), False),
    "softmax axis 1, inner 5 (too short)": (lambda: _softmax([2, 16, 5], 1), False),
    "YOLOv8 DFL, 2100 anchors": (lambda: _dfl(2100), True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_column_reduction_matches_onnxruntime(case) -> None:
    from forgekit.backends import cpu

    make, column = CASES[case]
    model = make()
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = (np.random.default_rng(3).standard_normal(shape) * 4).astype(np.float32)
    cpu.STATS.clear()
    got = forge.from_onnx(model).get_inference_function("host", opt_level=3)(x)
    assert_close(np.asarray(got), ort_run(model, {"x": x})[0])
    if column is not None:
        assert ("column_reduction" in cpu.STATS.values()) == column, cpu.STATS
    # a column reduction the column rule leaves goes to the fallback, which computes it once (see below)
    assert "fallback" not in cpu.STATS.values() or case in LEFT_TO_FALLBACK, cpu.STATS


LEFT_TO_FALLBACK = {"softmax axis 1, inner 5 (too short)"}


@pytest.mark.parametrize("shape", [[1, 64, 4, 8], [1, 256, 32, 8], [2, 16, 5]])
def test_the_row_rule_refuses_a_column_it_would_recompute(shape) -> None:
    """A softmax over axis 1 whose innermost axis is too short for the column rule (< one vector) went to the row
    rule, which parallelized the output's rows (every axis but the innermost, the reduced one included) and
    computed the max and the exp-sum inside each: once per channel that shares them.  [1, 256, 32, 8] took 60 ms
    (onnxruntime: 1.4), [1, 64, 4, 8] 0.55 ms (0.05); the fallback computes each once: 0.66 and 0.025 ms
    (backends/cpu/rules/reduction.row_loops)."""
    from forgekit.backends import cpu

    model = _softmax(shape, 1)
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * 4).astype(np.float32)
    cpu.STATS.clear()
    got = forge.from_onnx(model).get_inference_function("host", opt_level=3)(x)
    assert "reduction" not in cpu.STATS.values(), cpu.STATS
    assert_close(np.asarray(got), ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("anchors", [21, 84, 336])
def test_symbolic_anchors_keep_the_column_schedule(anchors: int) -> None:
    """A dynamic-size detector's anchor count is symbolic: the rule took static shapes only, and the DFL
    softmax of NudeNet 320n compiled with --dynamic H/W ran as a strided row reduction (1.04 ms at 128x128,
    15 % of the model; 0.03 ms with the rule).  Chunks of the symbolic axis are predicated."""
    from forgekit.backends import cpu

    model = _softmax([1, 16, 4, "A"], 1)
    x = (np.random.default_rng(anchors).standard_normal((1, 16, 4, anchors)) * 4).astype(np.float32)
    cpu.STATS.clear()
    run = forge.from_onnx(model, {"x": [1, 16, 4, "A"]}).get_inference_function("host", opt_level=3)
    assert "column_reduction" in cpu.STATS.values(), cpu.STATS
    assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("batch", [1, 3])
def test_a_symbolic_batch_keeps_the_column_schedule(batch: int) -> None:
    """A dynamic batch too (every kept axis may be symbolic, the reduced ones are static): NudeNet 320n in the
    PyPI corpus (batch, height and width dynamic) ran its DFL softmax as a row reduction whose max and exp-sum
    sat inside the parallel loop over the 16 bins as well, computed 16 times over: 8.2 ms of its 32 at 320x320
    (onnxruntime: 20 ms for the whole model)."""
    from forgekit.backends import cpu

    model = _softmax(["N", 16, 4, "A"], 1)
    x = (np.random.default_rng(batch).standard_normal((batch, 16, 4, 84)) * 4).astype(np.float32)
    cpu.STATS.clear()
    run = forge.from_onnx(model, {"x": ["N", 16, 4, "A"]}).get_inference_function("host", opt_level=3)
    assert "column_reduction" in cpu.STATS.values(), cpu.STATS
    assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])


def test_a_row_over_trailing_axes_is_computed_once_per_row() -> None:
    """LayerNormalization over the last two axes of [1, 16, 32, 64]: the row rule's row was every loop but the
    innermost (16 x 32), so the mean and variance over 32 x 64 ran 32 times over: 0.26 ms (onnxruntime 0.04).
    The row is now the 16 (n, c) the reductions keep: 0.025 ms."""
    from forgekit.backends import cpu
    from test_softmax_rows import _scheduled

    inits = [numpy_helper.from_array(np.linspace(0.5, 1.5, 32 * 64, dtype=np.float32).reshape(32, 64), "g"),
             numpy_helper.from_array(np.zeros((32, 64), np.float32), "b")]
    model = _model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-2)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    (code,) = _scheduled(model).values()
    assert "T.parallel(T.int64(16))" in code, code
    x = np.random.default_rng(5).standard_normal((1, 16, 32, 64)).astype(np.float32)
    cpu.STATS.clear()
    got = forge.from_onnx(model).get_inference_function("host", opt_level=3)(x)
    assert "reduction" in cpu.STATS.values(), cpu.STATS
    assert_close(np.asarray(got), ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("dims", [[1, 16, 4, 2100], ["N", 16, 4, "A"]])
def test_a_ragged_last_chunk_leaves_the_full_chunks_vectorized(dims) -> None:
    """The class: column reductions whose innermost extent is not a whole number of the rule's chunks (4
    vectors): a detector's anchors at most sizes (2100 at 320x320, 8400 at 640x640 with AVX-512), and every
    symbolic one.  The cut last chunk put a predicate on every block, and TVM's VectorizeLoop scalarized them
    all, in every chunk: the DFL softmax [1, 16, 4, 2100] took 0.26-0.35 ms against 0.06 at 2112 anchors, and
    [1, 64, 8400] over axis 1 1.7 ms (onnxruntime 1.0).  Now the cut chunk is split off by TVM's LoopPartition
    (the rule's hint, kept through NarrowDataType by stack_tiles.keep_partition_hints): 0.074 and 0.24 ms."""
    from conftest import scheduled_kernels, vectorized_tir

    model = _softmax(dims, 1)
    mod, run = scheduled_kernels(model, {"x": dims})
    (func,) = [f for gv, f in mod.functions.items() if gv.name_hint == "softmax"]
    lowered = vectorized_tir(func)
    assert "float32x" in lowered, lowered  # was: every loop scalar
    shape = [2 if d == "N" else 2100 if d == "A" else d for d in dims]
    x = (np.random.default_rng(5).standard_normal(shape) * 4).astype(np.float32)
    assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])
