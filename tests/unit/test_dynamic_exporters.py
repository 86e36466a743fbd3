"""Dynamic dimensions as exporters write them (issue 39): each class below failed to import, or imported and
then failed to compile, unless its dimension was pinned; now each imports, compiles and matches
onnxruntime at two or more sizes with the dimension still dynamic (forgekit/importer/converters: expand.py,
shapes.py, pool.py).  The models are built here with onnx.helper, one per exporter pattern."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run  # noqa: E402

F32 = TensorProto.FLOAT
n = helper.make_node


def _int(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.int64), name)


def _weight(name: str, shape: tuple, seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array((np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32), name)


def _model(nodes, inputs: dict, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, F32, v) for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", F32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _check(model: onnx.ModelProto, sizes: list[dict], level: int = 3) -> forgekit.IRModule:
    """Import with every dimension left dynamic, compile once, compare with onnxruntime at each size."""
    ir = forgekit.from_onnx(model)
    run = ir.get_inference_function("host", opt_level=level)
    for k, feed in enumerate(sizes):
        feeds = {name: np.random.default_rng(k).standard_normal(shape).astype(np.float32) for name, shape in feed.items()}
        assert_close(run(*feeds.values()), ort_run(model, feeds)[0])
    return ir


def torch_expand() -> onnx.ModelProto:
    """torch's ``x.expand(-1, 4, 8)`` on ``x[N, 1, 8]``: ``Expand(x, [1, 4, 8])`` (torch writes -1 as 1)."""
    return _model([n("Expand", ["x", "shape"], ["e"]), n("Add", ["e", "x"], ["y"])], {"x": ["N", 1, 8]},
                  [_int("shape", [1, 4, 8])])


def traced_expand(vector_index: bool) -> onnx.ModelProto:
    """torch's ``x.expand(-1, s.size(1), -1)`` with traced sizes: ``size = Concat(-1, S, -1)``,
    ``ones = ConstantOfShape(Shape(size))``, ``Expand(x, Where(Equal(size, -ones), ones, size))``; S taken
    with a scalar Gather + Unsqueeze (torch) or a one-element index (dynamo, optimum)."""
    take = ([n("Gather", ["ss", "i1v"], ["slen1"], axis=0)] if vector_index else
            [n("Gather", ["ss", "i1"], ["slen"], axis=0), n("Unsqueeze", ["slen", "z1"], ["slen1"])])
    nodes = [n("Shape", ["s"], ["ss"]), *take, n("Concat", ["m1", "slen1", "m1"], ["size"], axis=0),
             n("Shape", ["size"], ["sz"]),
             n("ConstantOfShape", ["sz"], ["ones"], value=numpy_helper.from_array(np.array([1], np.int64))),
             n("Mul", ["ones", "neg"], ["negs"]), n("Equal", ["size", "negs"], ["isneg"]),
             n("Where", ["isneg", "ones", "size"], ["size2"]), n("Expand", ["x", "size2"], ["e"]),
             n("Mul", ["e", "s"], ["y"])]
    return _model(nodes, {"x": ["N", 1, 8], "s": ["N", "S", 8]},
                  [_int("i1", 1), _int("i1v", [1]), _int("z1", [0]), _int("m1", [-1]), _int("neg", -1)])


def optimum_heads() -> onnx.ModelProto:
    """optimum's attention heads on ``x[B, T, 32]``: ``Reshape(q, Concat(Gather(Shape(q), [0, 1]), [4, -1]))``,
    a softmax per head, then ``Reshape(-1)`` back to ``Concat(Gather(Shape(q), [0, 1]), [-1])``."""
    nodes = [n("MatMul", ["x", "w"], ["q"]), n("Shape", ["q"], ["qs"]), n("Gather", ["qs", "bt"], ["lead"], axis=0),
             n("Concat", ["lead", "heads", "m1"], ["split"], axis=0), n("Reshape", ["q", "split"], ["qh"]),
             n("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]), n("Softmax", ["qt"], ["sm"], axis=-1),
             n("Transpose", ["sm"], ["st"], perm=[0, 2, 1, 3]), n("Concat", ["lead", "m1"], ["merge"], axis=0),
             n("Reshape", ["st", "merge"], ["r"]), n("Add", ["r", "x"], ["y"])]
    return _model(nodes, {"x": ["B", "T", 32]},
                  [_weight("w", (32, 32), 0), _int("bt", [0, 1]), _int("heads", [4]), _int("m1", [-1])])


def same_pool(kind: str, mode: str) -> onnx.ModelProto:
    """tf2onnx on an image model with a dynamic H x W: a 3x3 stride-2 pool and a 3x3 stride-2 conv, both
    ``auto_pad`` SAME, added (the two outputs must be provably the same size)."""
    nodes = [n(kind, ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], auto_pad=mode),
             n("Conv", ["x", "cw"], ["c"], kernel_shape=[3, 3], strides=[2, 2], auto_pad=mode),
             n("Add", ["p", "c"], ["y"])]
    return _model(nodes, {"x": [1, 4, "H", "W"]}, [_weight("cw", (4, 4, 3, 3), 1)])


def test_torch_expand_on_a_symbolic_batch() -> None:
    """Was: exit 4, "'Var' object has no attribute 'value'" (TVM read every input dim as a constant)."""
    ir = _check(torch_expand(), [{"x": (1, 1, 8)}, {"x": (3, 1, 8)}])
    assert ir.output_shapes == [("N", 4, 8)]


@pytest.mark.parametrize("vector_index", [False, True], ids=["torch", "dynamo"])
def test_traced_expand_sizes_stay_symbolic(vector_index: bool) -> None:
    """Was: the target shape became a runtime tensor, the result fresh symbols ``[x_0, x_1, x_2]`` that the
    Mul with ``s[N, S, 8]`` could not be proven to match (exit 4)."""
    ir = _check(traced_expand(vector_index), [{"x": (1, 1, 8), "s": (1, 5, 8)}, {"x": (2, 1, 8), "s": (2, 3, 8)}])
    assert ir.output_shapes == [("N", "S", 8)]


def test_optimum_head_split_and_merge() -> None:
    _check(optimum_heads(), [{"x": (1, 3, 32)}, {"x": (2, 7, 32)}])


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("kind", ["MaxPool", "AveragePool"])
def test_same_pooling_with_stride_2_on_a_symbolic_image(kind: str, mode: str) -> None:
    """Was: exit 4, "int() argument must be ... not 'Var'" (MaxPool) and "Cannot use and / or / not operator
    to Expr" (Conv): the pads depend on whether H is odd.  Odd, even and 1-pixel sizes."""
    ir = _check(same_pool(kind, mode), [{"x": (1, 4, 8, 8)}, {"x": (1, 4, 7, 9)}, {"x": (1, 4, 1, 2)}])
    assert ir.output_shapes == [(1, 4, "(H + 1) // 2", "(W + 1) // 2")]


def test_same_pooling_at_opt_level_0() -> None:
    _check(same_pool("MaxPool", "SAME_UPPER"), [{"x": (1, 4, 13, 6)}, {"x": (1, 4, 5, 5)}], level=0)


def test_one_artifact_serves_odd_and_even_sizes(tmp_path: Path) -> None:
    model = same_pool("AveragePool", "SAME_UPPER")
    forgekit.from_onnx(model).compile("host", output_path=tmp_path / "pool", opt_level=3)
    engine = forgekit.Engine(tmp_path / "pool")
    for shape in ((1, 4, 7, 9), (1, 4, 8, 8)):
        x = np.random.default_rng(shape[2]).standard_normal(shape).astype(np.float32)
        assert_close(engine.infer(x)[0], ort_run(model, {"x": x})[0])


def batch_squeezed() -> onnx.ModelProto:
    """``x[B, S]`` squeezed on axis 0: B must be 1 (ONNX refuses to squeeze any other size), S may vary."""
    return _model([n("Squeeze", ["x", "ax0"], ["s"]), n("Relu", ["s"], ["y"])], {"x": ["B", "S"]}, [_int("ax0", [0])])


def test_what_cannot_stay_dynamic_is_exit_3_with_a_range_for_the_rest(tmp_path: Path) -> None:
    """Was: exit 4 ("unsupported operators") with the advice to pin every dimension (S to 64).  Now: exit 3,
    the one dimension that must be pinned, the others kept dynamic with a range; the advice imports."""
    import subprocess

    from forgekit.importer.errors import DynamicDimensionError

    model = batch_squeezed()
    with pytest.raises(DynamicDimensionError) as err:
        forgekit.from_onnx(model)
    message = str(err.value)
    assert err.value.exit_code == 3 and "\n" not in message
    assert "pin B to the size you deploy with, e.g. --input-shape x=1xS, and keep S dynamic (--dynamic S=1..2048)" \
        in message, message
    ir = forgekit.from_onnx(model, {"x": [1, "S"]}, dynamic={"S": "1..2048"})
    run = ir.get_inference_function("host", opt_level=3)
    for length in (3, 11):
        x = np.random.default_rng(length).standard_normal((1, length)).astype(np.float32)
        assert_close(run(x), ort_run(model, {"x": x})[0])
    path = tmp_path / "squeeze.onnx"
    onnx.save(model, path)
    check = subprocess.run([sys.executable, "-m", "forgekit", "inspect", str(path), "--check"], capture_output=True,
                           text=True)
    assert check.returncode == 3 and "--dynamic S=1..2048" in check.stderr and "Traceback" not in check.stderr
    assert "imports" not in check.stdout and "kept dynamic" not in check.stdout  # it was not: the error says why


def vad(reshape_to: tuple[list[int], list[int]], inputs: dict) -> onnx.ModelProto:
    """Silero VAD's top level: ``If(sr == 16000)`` on a runtime input, each branch an LSTM (hidden 3) over
    ``x`` reshaped its own way (``reshape_to``: 16 kHz, 8 kHz) with its own input size; output Y_h."""

    def branch(name: str, shape: list[int], seed: int) -> onnx.GraphProto:
        size = shape[-1]
        inits = [_int(f"{name}_shape", shape), _weight(f"{name}_W", (1, 12, size), seed),
                 _weight(f"{name}_R", (1, 12, 3), seed + 1), _weight(f"{name}_B", (1, 24), seed + 2)]
        nodes = [n("Reshape", ["x", f"{name}_shape"], [f"{name}_x"]),
                 n("LSTM", [f"{name}_x", f"{name}_W", f"{name}_R", f"{name}_B"], ["", f"{name}_h"], hidden_size=3,
                   name=f"{name}_lstm")]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_h", F32, None)], inits)

    graph = helper.make_graph(
        [n("Equal", ["sr", "k16"], ["is16"]),
         n("If", ["is16"], ["y"], name="rate", then_branch=branch("then", reshape_to[0], 3),
           else_branch=branch("else", reshape_to[1], 6))],
        "g", [helper.make_tensor_value_info("x", F32, inputs["x"]), helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", F32, None)], [_int("k16", 16000)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _vad_run(model, run, x: np.ndarray, rate: int):
    sr = np.array(rate, np.int64)
    return run(x, sr), ort_run(model, {"x": x, "sr": sr})[0]


def test_lstm_in_a_runtime_if_at_a_size_only_one_branch_takes(tmp_path: Path) -> None:
    """Silero VAD pinned to 512 samples with a runtime ``sr``: the 8 kHz branch's LSTM cannot take that
    chunk (onnxruntime fails if it is taken).  Was: the import failed ("Matmul requires the reduction length
    ..."), exit 4, unless sr was frozen.  Now the 16 kHz branch matches and the other raises when taken, in
    the artifact too (a kernel's assertion: Relax's assert_op is missing from the runtimes)."""
    model = vad(([1, 1, 8], [1, 1, 4]), {"x": [1, "L"]})
    forgekit.from_onnx(model, {"x": [1, 8]}).compile("host", output_path=tmp_path / "vad", opt_level=3)
    engine = forgekit.Engine(tmp_path / "vad")
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    assert_close(*_vad_run(model, lambda *a: engine.infer(*a)[0], x, 16000))
    with pytest.raises(Exception, match="If node 'rate': its branch 'else' cannot be converted at these input shapes"):
        engine.infer(x, np.array(8000, np.int64))
    run4 = forgekit.from_onnx(model, {"x": [1, 4]}).get_inference_function("host", opt_level=3)
    assert_close(*_vad_run(model, run4, x[:, :4], 8000))


def test_lstm_in_a_runtime_if_on_a_dynamic_length() -> None:
    """Both branches' LSTMs over a dynamic number of steps (16 kHz: T steps of 8, 8 kHz: 2T steps of 4)."""
    model = vad(([-1, 1, 8], [-1, 1, 4]), {"x": ["T", 8]})
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=3)
    for steps in (1, 5):
        x = np.random.default_rng(steps).standard_normal((steps, 8)).astype(np.float32)
        for rate in (16000, 8000):
            assert_close(*_vad_run(model, run, x, rate))


def decoder() -> onnx.ModelProto:
    """A seq2seq decoder step: ``tgt[1, T, 16]`` attends to the encoder's ``memory[1, src_len, 16]``."""
    nodes = [n("MatMul", ["tgt", "wq"], ["q"]), n("MatMul", ["memory", "wk"], ["k"]),
             n("MatMul", ["memory", "wv"], ["v"]), n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             n("MatMul", ["q", "kt"], ["s"]), n("Softmax", ["s"], ["a"], axis=-1), n("MatMul", ["a", "v"], ["y"])]
    return _model(nodes, {"tgt": [1, "T", 16], "memory": [1, "src_len", 16]},
                  [_weight("wq", (16, 16), 2), _weight("wk", (16, 16), 3), _weight("wv", (16, 16), 4)])


def test_a_decoder_attending_to_a_second_inputs_length() -> None:
    """Was: ``inspect --check`` said the model imports, then ``compile`` failed (exit 6, 'undefined variable
    src_len'): backends/cpu/dynamic_matmul.py's padded matmul read its reduction extent from the Relax call,
    not from its placeholders' shapes (a symbolic reduction that is not also a row or column)."""
    _check(decoder(), [{"tgt": (1, 3, 16), "memory": (1, 5, 16)}, {"tgt": (1, 1, 16), "memory": (1, 9, 16)}])


def test_a_decoder_attending_to_a_second_inputs_length_below_opt_level_3() -> None:
    _check(decoder(), [{"tgt": (1, 3, 16), "memory": (1, 5, 16)}, {"tgt": (1, 1, 16), "memory": (1, 9, 16)}], level=2)


def test_a_runtime_if_whose_branches_both_fail_is_an_import_error() -> None:
    """Neither branch takes 6 samples: the first branch's error (was: a RecursionError, each branch
    standing in for the other)."""
    from forgekit.importer.errors import ConversionError

    with pytest.raises(ConversionError, match=r"Reshape node .*R.shape\(\[1, 1, 8\]\)"):
        forgekit.from_onnx(vad(([1, 1, 8], [1, 1, 4]), {"x": [1, "L"]}), {"x": [1, 6]})

