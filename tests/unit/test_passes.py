"""Graph passes (forgekit/passes/): the slice canonicalization that fixed a miscompile class, numpy folding,
the ConvertLayout fallback, and the opt-level registry.  Every model is compared with onnxruntime at every
opt level, on several values of its dynamic dimension."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from conftest import assert_close, ort_run
from forgekit.passes import GRAPH_PASSES, OPT_LEVELS, graph_passes, register_pass

INT64_MAX = 2**63 - 1


def _model(nodes, inputs, outputs, inits, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def slice_conv(starts: list[int], ends: list[int], axes: list[int]) -> onnx.ModelProto:
    """The trust issue's 4-node repro: Slice (on the batch axis too) -> Unsqueeze -> Conv -> Relu, batch N."""
    w = np.random.default_rng(0).standard_normal((4, 1, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Unsqueeze", ["s", "uax"], ["u"]),
             helper.make_node("Conv", ["u", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    inits = [_ints("starts", starts), _ints("ends", ends), _ints("axes", axes), _ints("uax", [1]),
             numpy_helper.from_array(w, "w")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 10, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 4, "H", 8])], inits)


def keras_cropping() -> onnx.ModelProto:
    """What tf2onnx writes for Keras ``Cropping1D((2, 2))`` on a dynamic batch, then a dense head:
    Slice(starts [0, 2], ends [INT64_MAX, -2], axes [0, 1]) -> Conv1D -> ReduceMean -> MatMul."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Conv", ["t", "w"], ["c"], pads=[1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["m"], axes=[2], keepdims=0),
             helper.make_node("MatMul", ["m", "d"], ["y"])]
    inits = [_ints("starts", [0, 2]), _ints("ends", [INT64_MAX, -2]), _ints("axes", [0, 1]),
             numpy_helper.from_array((rng.standard_normal((8, 40, 3)) * 0.2).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "d")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 100, 40])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], inits, opset=13)


def _check_every_level(model: onnx.ModelProto, shape: tuple[int, ...], batches=(1, 3, 8)) -> None:
    ir = forgekit.from_onnx(model)
    for level in OPT_LEVELS:
        run = ir.get_inference_function("host", opt_level=level)
        for batch in batches:
            x = np.random.default_rng(batch).random((batch, *shape), dtype=np.float32)
            expected = ort_run(model, {"x": x})[0]
            got = run(x)
            assert got.shape == expected.shape, (level, batch)
            if expected.size:
                assert_close(got, expected)


@pytest.mark.parametrize("starts, ends, axes", [
    ([0, 1], [INT64_MAX, INT64_MAX], [0, 1]),  # the repro: "DataflowBlock Pass should not rewrite..." at O3
    ([0], [5], [0]),  # a static end on the symbolic batch: ConvertLayout fails, NCHW fallback
    ([1], [-1], [0]),  # x[1:-1] on N = 1: TVM's length was -1 (std::bad_alloc)
    ([2], [INT64_MAX], [0]),  # x[2:] on N = 1: empty
    ([0, 1], [2**31 - 1, 9], [0, 1]),  # INT32_MAX "to the end"
])
def test_slices_on_a_symbolic_batch_at_every_level(starts, ends, axes) -> None:
    _check_every_level(slice_conv(starts, ends, axes), (10, 8))


def test_keras_cropping_on_a_dynamic_batch_at_every_level() -> None:
    model = keras_cropping()
    assert forgekit.from_onnx(model).output_shapes == [("N", 3)]  # not T.min(9223372036854775807, N)
    _check_every_level(model, (100, 40))


def test_numpy_folding_keeps_0d_constants_0d() -> None:
    """np.ascontiguousarray turned a folded 0-d constant into shape (1,): TVM's default build then failed with
    'params.size() == args.size() (0 vs. 1)' on a Clip (ReLU6) at opt level 2."""
    from tvm import relax

    from forgekit.passes.numpy_fold import fold_constants_numpy

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            cond = bb.emit(relax.op.isnan(relax.const(0.0, "float32")))
            zero = bb.emit(relax.op.where(cond, relax.const(1.0, "float32"), relax.const(0.0, "float32")))
            out = bb.emit_output(relax.op.maximum(x, zero))
        bb.emit_func_output(out)
    folded = fold_constants_numpy(bb.get())
    (binding,) = folded["main"].body.blocks[0].bindings
    assert binding.value.args[1].value.numpy().shape == ()


def test_registry_by_level_and_options() -> None:
    names = {level: [p.info.name for p in graph_passes(level)] for level in OPT_LEVELS}
    # TVM's FoldConstant (kept from leaving a call to a function it dropped: forgekit.passes.numpy_fold), under
    # its own name: compile_report.json lists it
    assert "FoldConstant" not in names[0] and "FoldConstant" in names[1]
    assert "forgekit.FoldBatchNorm" in names[2] and "forgekit.FoldBatchNorm" not in names[1]
    assert "forgekit.FuseTransposeMatmulIfStatic" in names[3]
    assert "ToMixedPrecision" in [p.info.name for p in graph_passes(3, precision="float16")]
    assert "forgekit.ToNHWCOrKeep" in [p.info.name for p in graph_passes(0, layout="last")]
    with pytest.raises(ValueError, match="already registered"):
        register_pass(GRAPH_PASSES[0].name, 0, GRAPH_PASSES[0].make)


# ---------------------------------------------------------------- layout-friendly canonical forms (PP-OCRv4 det)
def _nhwc_graph(model: onnx.ModelProto, shape: dict) -> str:
    """The CPU backend's Relax prefix (folding, batch-norms, transposed convs, NHWC) as TVMScript."""
    import tvm

    from forgekit.backends.cpu import preprocess

    mod = tvm.transform.Sequential(graph_passes(3))(forgekit.from_onnx(model, shape).mod)
    return preprocess()(mod)["main"].script()


def affine_between_convs(scale_shape: list[int]) -> onnx.ModelProto:
    """conv -> Mul(constant, x) -> Add(x, constant) -> HardSwish -> conv: PP-LCNet's learnable affine block,
    whose one-element constant came first and kept every such op in NCHW (two transposes each)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["s", "c1"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("HardSwish", ["a"], ["h"]), helper.make_node("Sub", ["h", "b"], ["d"]),
             helper.make_node("Conv", ["d", "w2"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
             numpy_helper.from_array(rng.standard_normal((8, 16, 1, 1)).astype(np.float32) * 0.3, "w2"),
             numpy_helper.from_array(np.full(scale_shape, 1.7, np.float32), "s"),
             numpy_helper.from_array(np.full(scale_shape, 0.2, np.float32), "b")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 12, 12])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 12, 12])], inits)


@pytest.mark.parametrize("scale_shape", [[1], [1, 1, 1, 1], []])
def test_one_element_constants_first_keep_the_graph_in_nhwc(scale_shape) -> None:
    model = affine_between_convs(scale_shape)
    script = _nhwc_graph(model, {"x": [2, 3, 12, 12]})
    # one transpose in (NCHW input), one out (NCHW output): none between the convolutions
    assert script.count("R.permute_dims") == 2, script
    _check_every_level(model, (3, 12, 12), batches=(1, 3))


def conv_transpose(kernel: int, stride: int, pads: int = 0, output_padding: int = 0, group: int = 1,
                   bias: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(kernel * 10 + stride)
    attrs = {"kernel_shape": [kernel, kernel], "strides": [stride, stride], "pads": [pads] * 4, "group": group}
    if output_padding:
        attrs["output_padding"] = [output_padding] * 2
    cin, cout = 8, 6
    nodes = [helper.make_node("ConvTranspose", ["x", "w"] + (["b"] if bias else []), ["t"], **attrs),
             helper.make_node("Sigmoid", ["t"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((cin, cout // group, kernel, kernel)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")][: 2 if bias else 1]
    h, w = ((n - 1) * stride - 2 * pads + kernel + output_padding for n in (5, 7))
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", cin, 5, 7])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", cout, h, w])], inits)


@pytest.mark.parametrize("kernel, stride, bias", [(2, 2, True), (3, 3, False), (4, 4, True)])
def test_stride_sized_transposed_convs_become_1x1_convs(kernel, stride, bias) -> None:
    """The DB/U-Net upsampling head: no conv2d_transpose (TVM's unscheduled loop nest) is left, and the 1x1
    convolution + depth-to-space computes what onnxruntime's ConvTranspose does, at every level."""
    model = conv_transpose(kernel, stride, bias=bias)
    script = _nhwc_graph(model, {"x": [2, 8, 5, 7]})
    assert "conv2d_transpose" not in script and "R.nn.conv2d(" in script
    _check_every_level(model, (8, 5, 7), batches=(1, 3))


@pytest.mark.parametrize("kernel, stride, pads, output_padding, group", [
    (5, 2, 1, 1, 1),  # a kernel over 4 at stride 2 (general kernels: tests/unit/test_conv_transpose.py)
    (2, 2, 0, 0, 2),  # grouped
    (5, 3, 1, 0, 1),  # stride 3 smaller than the kernel
])
def test_other_transposed_convs_are_left_alone_and_still_match(kernel, stride, pads, output_padding, group) -> None:
    model = conv_transpose(kernel, stride, pads, output_padding, group)
    assert "conv2d_transpose" in _nhwc_graph(model, {"x": [2, 8, 5, 7]})
    _check_every_level(model, (8, 5, 7), batches=(1, 3))


@pytest.mark.parametrize(("m", "n", "expected"), [(128, 128, False), (101, 101, True), (197, 64, True),
                                                   (3, 48, False), (1, 100, True), (64, 24, True)])
def test_transposed_matmuls_keep_forgekits_padding_when_ragged(m: int, n: int, expected: bool) -> None:
    """FuseTransposeMatmul's NT_matmul bypasses forgekit's padded matmul: it runs only where the shapes tile
    well as they are (BERT's 128 tokens), not on ViT's 101 tokens or columns that are not whole vectors."""
    from forgekit.passes.transpose_matmul import ragged

    assert ragged(m, n) is expected


def _parallel_matmuls(kinds: tuple[str, ...], batch: int | str = "N") -> onnx.ModelProto:
    """Matmuls of one ``x[batch, 6]`` by weights (``const``) or by run-time inputs (``input``), each an output."""
    rng = np.random.default_rng(len(kinds))
    inputs, inits, nodes, outputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 6])], [], [], []
    for i, kind in enumerate(kinds):
        if kind == "const":
            inits.append(numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), f"w{i}"))
        else:
            inputs.append(helper.make_tensor_value_info(f"w{i}", TensorProto.FLOAT, [6, 5]))
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [batch, 5]))
    return _model(nodes, inputs, outputs, inits)


@pytest.mark.parametrize("kinds", [("const", "input"), ("const", "const", "input"), ("input", "const")])
@pytest.mark.parametrize("level", OPT_LEVELS)
def test_parallel_matmuls_mixing_weights_and_inputs_on_a_symbolic_batch(kinds, level) -> None:
    """The class: matmuls sharing a left operand with a symbolic dim whose right operands mix constants and run-time
    tensors.  TVM 0.27's CombineParallelMatmul failed inside its pattern rewriter ("Cannot treat type `ir.PrimType`
    as type `relax.TensorType`", fuzz seed 4099), a compile error at levels 3-4; now they stay apart there and
    match onnxruntime at every level and two batch sizes."""
    model = _parallel_matmuls(kinds)
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=level)
    rng = np.random.default_rng(0)
    for batch in (1, 7):
        feeds = {"x": rng.standard_normal((batch, 6)).astype(np.float32)}
        feeds.update({f"w{i}": rng.standard_normal((6, 5)).astype(np.float32)
                      for i, kind in enumerate(kinds) if kind == "input"})
        outs = run(*feeds.values())
        for got, want in zip(outs, ort_run(model, feeds)):
            assert_close(np.asarray(got), want)


def test_parallel_matmuls_by_run_time_tensors_are_still_combined() -> None:
    """What TVM's pass does is kept where it works: matmuls of one dynamic batch by run-time tensors (weights fed as
    inputs) become one.  (It leaves constant right operands alone in any case.)"""
    from forgekit.passes import _combine_parallel_matmul

    mod = _combine_parallel_matmul()(forgekit.from_onnx(_parallel_matmuls(("input", "input"))).mod)
    assert mod["main"].script().count("R.matmul(") == 1
