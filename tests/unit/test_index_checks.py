"""Indices read from a model's inputs are bounds-checked (forgekit/passes/index_checks.py): every gather-like
operator, at every opt level and precision, refuses an out-of-range index with one line (InputError, exit 9)
and still matches onnxruntime on valid ones, negative indices included.

Without the checks an index a few rows past a table returned another tensor's bytes with exit 0 (every
``pytest.raises`` below fails) and an index of 2e9 killed the process with SIGSEGV (the CLI test: exit -11).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from forgekit.errors import InputError
from forgekit.runtime import Engine

onnxruntime = pytest.importorskip("onnxruntime")

TABLE = np.arange(8, dtype=np.float32).reshape(2, 4)  # a 2-row embedding table (token types)
DATA = np.arange(15, dtype=np.float32).reshape(3, 5)
SCATTER_DATA = np.zeros((4, 3), np.float32)
#: input -> (valid value, invalid values); each invalid one must be refused by the operator it feeds
CASES = {
    "ids": (np.array([[0, 1, -1, -2]], np.int64), [2, -3, 7]),                       # Gather axis 0
    "cols": (np.array([[0, 4], [-1, 2], [3, -5]], np.int64), [5, -6]),               # GatherElements axis 1
    "nd": (np.array([[2, 4], [-3, -1]], np.int64), [3, -4]),                          # GatherND (row, col)
    "snd": (np.array([[3], [-4]], np.int64), [4, -5]),                                # ScatterND
    "sel": (np.array([[2, 0], [-1, 1]], np.int32), [3, -4]),                          # ScatterElements axis 0
}
OPS = {"ids": "Gather", "cols": "GatherElements", "nd": "GatherND", "snd": "ScatterND", "sel": "ScatterElements"}


def gathers_model() -> onnx.ModelProto:
    """One model, every gather-like operator fed by an input of its own, then a MatMul (what int8 and bf16
    builds compute in reduced precision) on the embedding; OneHot with out-of-range values (all-off rows)."""
    inits = [numpy_helper.from_array(TABLE, "table"), numpy_helper.from_array(DATA, "data"),
             numpy_helper.from_array(SCATTER_DATA, "sdata"),
             numpy_helper.from_array(np.ones((2, 3), np.float32), "supd"),
             numpy_helper.from_array(np.full((2, 2), 5.0, np.float32), "eupd"),
             numpy_helper.from_array(np.zeros((3, 3), np.float32), "edata"),
             numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16), "w"),
             numpy_helper.from_array(np.array([4], np.int64), "depth"),
             numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "onoff")]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        helper.make_node("MatMul", ["emb", "w"], ["proj"]),
        helper.make_node("GatherElements", ["data", "cols"], ["ge"], axis=1),
        helper.make_node("GatherND", ["data", "nd"], ["gnd"]),
        helper.make_node("ScatterND", ["sdata", "snd", "supd"], ["snd_out"]),
        helper.make_node("ScatterElements", ["edata", "sel", "eupd"], ["se"], axis=0),
        helper.make_node("OneHot", ["hot", "depth", "onoff"], ["oh"], axis=-1),
    ]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "S"]),
              helper.make_tensor_value_info("cols", TensorProto.INT64, [3, 2]),
              helper.make_tensor_value_info("nd", TensorProto.INT64, [2, 2]),
              helper.make_tensor_value_info("snd", TensorProto.INT64, [2, 1]),
              helper.make_tensor_value_info("sel", TensorProto.INT32, [2, 2]),
              helper.make_tensor_value_info("hot", TensorProto.INT64, [5])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in
               (("proj", [1, "S", 16]), ("ge", [3, 2]), ("gnd", [2]), ("snd_out", [4, 3]), ("se", [3, 3]),
                ("oh", [5, 4]))]
    model = helper.make_model(helper.make_graph(nodes, "gathers", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _feeds(**bad: int) -> dict[str, np.ndarray]:
    feeds = {name: valid.copy() for name, (valid, _) in CASES.items()}
    feeds["hot"] = np.array([0, 3, -1, 4, -9], np.int64)  # 4 and -9: all-off rows, as ONNX and onnxruntime say
    for name, value in bad.items():
        feeds[name].flat[0] = value
    return feeds


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("gathers") / "gathers.onnx"
    onnx.save(gathers_model(), path)
    return str(path)


def _reference(path: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)


def _check_engine(engine: Engine, path: str, atol: float = 1e-5) -> None:
    feeds = _feeds()
    for got, want in zip(engine.infer(feeds), _reference(path, feeds)):
        np.testing.assert_allclose(got.reshape(want.shape), want, atol=atol * max(1.0, float(np.abs(want).max())))
    for name, (_, bad_values) in CASES.items():
        for bad in bad_values:
            with pytest.raises(InputError, match=rf"Index out of range: an index from input '{name}'.*{OPS[name]}"):
                engine.infer(_feeds(**{name: bad}))
            with pytest.raises(Exception):  # onnxruntime refuses them too
                _reference(path, _feeds(**{name: bad}))


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3, 4])
def test_every_gather_refuses_bad_indices_at_every_level(model_path, tmp_path, opt_level) -> None:
    ir = forge.from_onnx(model_path)
    ir.compile(target="host", output_path=tmp_path / "out", opt_level=opt_level)
    _check_engine(Engine(tmp_path / "out"), model_path)


def test_portable_default_target(model_path, tmp_path) -> None:
    forge.from_onnx(model_path).compile(output_path=tmp_path / "out")
    _check_engine(Engine(tmp_path / "out"), model_path)


def test_int8_and_bf16_builds(model_path, tmp_path) -> None:
    from forgekit.runtime.cpu import host_features

    ir = forge.from_onnx(model_path)
    rng = np.random.default_rng(0)
    ir.calibrate([{**_feeds(), "ids": rng.integers(0, 2, (1, 4))} for _ in range(4)])
    ir.quantize(quant_type="static")
    ir.compile(target="host", output_path=tmp_path / "int8")
    _check_engine(Engine(tmp_path / "int8"), model_path, atol=0.05)
    if "avx512bf16" in host_features():
        forge.from_onnx(model_path).compile(target="host", output_path=tmp_path / "bf16", set_bfloat16=True)
        _check_engine(Engine(tmp_path / "bf16"), model_path, atol=0.02)


def test_symbolic_axis(tmp_path) -> None:
    """The indexed axis is an input's dynamic dimension: the bound is read at run time."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "k"], ["y"], axis=1)], "sym",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "L"]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    forge.from_onnx(model).compile(target="host", output_path=tmp_path / "out")
    engine = Engine(tmp_path / "out")
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_array_equal(engine.infer(x, np.array([0, 4, -5]))[0], x[:, [0, 4, 0]])
    with pytest.raises(InputError, match="outside the axis it indexes in a Gather"):
        engine.infer(x, np.array([0, 5, 1]))
    x = np.arange(14, dtype=np.float32).reshape(2, 7)  # a longer axis makes 5 and 6 valid
    np.testing.assert_array_equal(engine.infer(x, np.array([5, 6, -7]))[0], x[:, [5, 6, 0]])


def test_message_names_the_input_as_onnx_spells_it(tmp_path) -> None:
    """The build renames inputs to C identifiers (names.py); the message keeps the user's name."""
    table = numpy_helper.from_array(TABLE, "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "serving_default_ids:0"], ["y"])], "n",
                              [helper.make_tensor_value_info("serving_default_ids:0", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    forge.from_onnx(model).compile(target="host", output_path=tmp_path / "out", opt_level=0)
    with pytest.raises(InputError, match="from input 'serving_default_ids:0'"):
        Engine(tmp_path / "out").infer(np.array([0, 2, 1]))


def test_cli_run_is_one_line_exit_9_never_a_signal(model_path, tmp_path) -> None:
    forge.from_onnx(model_path).compile(target="host", output_path=tmp_path / "out")
    np.savez(tmp_path / "bad.npz", **_feeds(ids=2_000_000_000))  # 8 GB past the table: SIGSEGV unchecked
    proc = subprocess.run([sys.executable, "-m", "forgekit", "run", str(tmp_path / "out"), "--input",
                           str(tmp_path / "bad.npz")], capture_output=True, text=True)
    assert proc.returncode == 9, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Index out of range" in lines[0] and "'ids'" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
