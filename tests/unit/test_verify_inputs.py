"""What verify/bench/run --random feed an artifact (issue 38): indices inside the table they index (the graph's
own bounds, forgekit/importer/index_ranges.py), an int8 model's calibration range, the values of inputs
compiled away with --freeze (fed to onnxruntime), and the user's own arrays (verify --input).  Each class: a
correct artifact passes and a wrong reference (another model's weights or arithmetic) still fails."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import run_cli
from forgekit.importer.index_ranges import index_bounds
from forgekit.runtime.inputs import example_inputs


def _model(nodes, inputs, outputs, inits=None, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                              [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _embedding(rows: int = 2, seed: int = 0) -> onnx.ModelProto:
    """ids (int32) -> Cast -> Gather from a ``rows``-row table -> sum over the sequence."""
    table = np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)
    nodes = [helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
             helper.make_node("Gather", ["table", "ids64"], ["vec"], axis=0),
             helper.make_node("ReduceSum", ["vec", "axes"], ["out"], keepdims=0)]
    return _model(nodes, [("ids", TensorProto.INT32, [1, 6])], [("out", TensorProto.FLOAT, [1, 8])],
                  {"table": table, "axes": np.array([1], np.int64)})


def _metadata_inputs(artifact: Path) -> list[dict]:
    return json.loads((artifact / "metadata.json").read_text())["model"]["inputs"]


def _verify(artifact: Path, onnx_path: Path, *args: str):
    return run_cli("verify", str(artifact), "--onnx", str(onnx_path), *args)


# ----------------------------------------------------------------------------- index bounds, read off the graph
def test_index_bounds_follow_indices_through_shape_ops_to_every_table() -> None:
    """The least size of every axis an integer input indexes, through Cast/Unsqueeze/Reshape...; inputs that
    index nothing (or a table of unknown size) have none."""
    nodes = [helper.make_node("Unsqueeze", ["ids", "zero"], ["u"]),
             helper.make_node("Reshape", ["u", "flat"], ["r"]),
             helper.make_node("Gather", ["big", "r"], ["a"], axis=0),  # 50 rows
             helper.make_node("Gather", ["small", "ids"], ["b"], axis=1),  # 7 columns: the bound
             helper.make_node("OneHot", ["cls", "depth", "onoff"], ["c"]),
             helper.make_node("Add", ["plain", "plain"], ["d"]),
             helper.make_node("GatherElements", ["dyn", "pos"], ["e"], axis=0),
             helper.make_node("Transpose", ["tbl"], ["tbl_t"], perm=[1, 0]),  # a table of inferred shape
             helper.make_node("Gather", ["tbl_t", "row"], ["f"], axis=0)]
    model = _model(nodes, [("ids", TensorProto.INT64, [4]), ("cls", TensorProto.INT64, [3]),
                           ("plain", TensorProto.INT64, [3]), ("dyn", TensorProto.FLOAT, ["N", 2]),
                           ("pos", TensorProto.INT64, [1, 2]), ("row", TensorProto.INT64, [2])],
                   [(n, TensorProto.FLOAT, None) for n in "abcef"] + [("d", TensorProto.INT64, None)],
                   {"big": np.zeros((50, 4), np.float32), "small": np.zeros((2, 7), np.float32),
                    "zero": np.array([0], np.int64), "flat": np.array([-1], np.int64),
                    "depth": np.array(5, np.int64), "onoff": np.array([0, 1], np.float32),
                    "tbl": np.zeros((3, 6), np.float32)})
    assert index_bounds(model) == {"ids": 7, "cls": 5, "row": 6}


def test_gather_nd_bounds_by_the_axes_its_last_index_dimension_picks() -> None:
    nodes = [helper.make_node("GatherND", ["data", "idx"], ["y"])]
    model = _model(nodes, [("idx", TensorProto.INT64, [3, 2])], [("y", TensorProto.FLOAT, None)],
                   {"data": np.zeros((9, 4, 30), np.float32)})
    assert index_bounds(model) == {"idx": 4}  # picks axes 0 and 1 (9 and 4 rows)


def test_example_inputs_draw_inside_the_recorded_values() -> None:
    specs = [{"name": "ids", "shape": [1000], "dtype": "int64", "values": {"min": 0, "max": 1}},
             {"name": "x", "shape": [1000], "dtype": "float32",
              "values": {"min": 0.0, "max": 255.0, "mean": 130.0, "std": 60.0}},
             {"name": "old", "shape": [1000], "dtype": "int64"}]
    ids, x, old = example_inputs(specs)
    assert set(np.unique(ids)) == {0, 1}
    assert x.min() >= 0 and x.max() <= 255 and 120 < x.mean() < 140 and 50 < x.std() < 70
    assert old.min() >= 0 and old.max() == 9  # no "values" (older artifacts): as before


# ----------------------------------------------------------------------------- each class, end to end
def test_an_embedding_artifact_is_verified_on_indices_inside_its_table(tmp_path) -> None:
    """A 2-row table: integers in [0, 10) made onnxruntime refuse the inputs (exit 9, 'is it the model...?')
    and run --random read past the table.  The artifact now records ids in [0, 1]."""
    onnx.save(_embedding(), tmp_path / "m.onnx")
    onnx.save(_embedding(seed=1), tmp_path / "wrong.onnx")
    forge.from_onnx(tmp_path / "m.onnx").compile(target="host", output_path=tmp_path / "a", opt_level=1)
    assert _metadata_inputs(tmp_path / "a")[0]["values"] == {"min": 0, "max": 1}
    proc = _verify(tmp_path / "a", tmp_path / "m.onnx")
    assert proc.returncode == 0, proc.stderr
    assert _verify(tmp_path / "a", tmp_path / "wrong.onnx").returncode == 13
    proc = run_cli("bench", str(tmp_path / "a"), "--onnx", str(tmp_path / "m.onnx"), "-n", "2", "--no-memory")
    assert proc.returncode == 0 and "outputs       match" in proc.stdout, proc.stderr
    proc = run_cli("run", str(tmp_path / "a"), "--random", "--bench", "0")
    assert proc.returncode == 0, proc.stderr


def test_an_artifact_built_with_freeze_is_verified_with_the_frozen_value(tmp_path) -> None:
    """--freeze scale=3 removes the input from the artifact, not from the ONNX model: verify fed onnxruntime
    without it (exit 9, always).  The metadata records the value and verify feeds it."""
    def scaled(op: str) -> onnx.ModelProto:
        return _model([helper.make_node(op, ["x", "scale"], ["y"])],
                      [("x", TensorProto.FLOAT, [1, 4]), ("scale", TensorProto.FLOAT, [1])],
                      [("y", TensorProto.FLOAT, [1, 4])])

    onnx.save(scaled("Mul"), tmp_path / "m.onnx")
    onnx.save(scaled("Add"), tmp_path / "wrong.onnx")
    proc = run_cli("compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "a"), "-t", "host", "-O", "1",
                   "--freeze", "scale=3")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "a" / "metadata.json").read_text())["model"]["frozen"] == {"scale": 3}
    proc = _verify(tmp_path / "a", tmp_path / "m.onnx")
    assert proc.returncode == 0, proc.stderr
    assert _verify(tmp_path / "a", tmp_path / "wrong.onnx").returncode == 13
    # bench feeds it too, and to OpenVINO, which runs the ONNX model (timed and alone for its memory)
    proc = run_cli("bench", str(tmp_path / "a"), "--onnx", str(tmp_path / "m.onnx"), "-n", "2", "--peer", "openvino")
    assert proc.returncode == 0 and "outputs       match" in proc.stdout, proc.stderr
    assert "its outputs match onnxruntime's" in proc.stdout, proc.stdout


def _classifier(seed: int = 0) -> onnx.ModelProto:
    """conv-relu-conv-relu-pool-fc on 3x16x16 inputs."""
    rng = np.random.default_rng(seed)
    inits = {"w1": (rng.standard_normal((16, 3, 3, 3)) * 0.2).astype(np.float32), "b1": np.zeros(16, np.float32),
             "w2": (rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), "b2": np.zeros(16, np.float32),
             "fc": rng.standard_normal((10, 16)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["logits"], transB=1)]
    return _model(nodes, [("x", TensorProto.FLOAT, [1, 3, 16, 16])], [("logits", TensorProto.FLOAT, [1, 10])], inits)


def _pictures(count: int = 16) -> np.ndarray:
    """Smooth patterns in [0, 255], as pixels a model without normalization takes."""
    rng = np.random.default_rng(5)
    yy, xx = np.mgrid[0:16, 0:16] / 16.0
    out = []
    for _ in range(count):
        freq = rng.uniform(0, 6, (3, 2))
        phase = rng.uniform(0, 6, (3, 1, 1))
        out.append(127.5 + 127.5 * np.sin(freq[:, :1, None] * xx + freq[:, 1:, None] * yy + phase))
    return np.stack(out)[:, None].astype(np.float32)


def test_an_int8_artifact_is_judged_on_its_calibration_range(tmp_path) -> None:
    """Calibrated on pixels in [0, 255], a correct int8 classifier is all rounding error on U[0, 1) inputs
    (cosine -0.01 with fp32: exit 13, 'the timing is of a wrong model'); judged on inputs of its calibration
    range and moments it matches (cosine 0.99998), and a model with other weights still fails.  verify --input
    runs the user's own pictures."""
    onnx.save(_classifier(), tmp_path / "m.onnx")
    onnx.save(_classifier(seed=1), tmp_path / "wrong.onnx")
    ir = forge.from_onnx(tmp_path / "m.onnx")
    ir.calibrate(list(_pictures()))
    ir.quantize()
    ir.compile(target="host", output_path=tmp_path / "a", opt_level=1)
    values = _metadata_inputs(tmp_path / "a")[0]["values"]
    assert values["min"] >= 0 and 250 < values["max"] <= 255 and 100 < values["mean"] < 160 and values["std"] > 50
    proc = _verify(tmp_path / "a", tmp_path / "m.onnx")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _verify(tmp_path / "a", tmp_path / "wrong.onnx").returncode == 13
    proc = run_cli("bench", str(tmp_path / "a"), "--onnx", str(tmp_path / "m.onnx"), "-n", "2", "--no-memory")
    assert proc.returncode == 0 and "outputs       match" in proc.stdout, proc.stdout + proc.stderr
    np.save(tmp_path / "pic.npy", _pictures(17)[16])
    proc = _verify(tmp_path / "a", tmp_path / "m.onnx", "--input", f"x={tmp_path / 'pic.npy'}")
    assert proc.returncode == 0 and "the --input arrays" in proc.stdout, proc.stdout + proc.stderr
    proc = run_cli("bench", str(tmp_path / "a"), "--onnx", str(tmp_path / "m.onnx"), "-n", "2", "--no-memory",
                   "--input", f"x={tmp_path / 'pic.npy'}")
    assert proc.returncode == 0 and "outputs       match" in proc.stdout, proc.stdout + proc.stderr


def test_verify_input_takes_the_users_arrays_and_refuses_wrong_ones(tmp_path) -> None:
    """verify --input, as run --input: name=file.npy, file.npz; a name the model lacks or a wrong shape is one
    line, exit 9."""
    onnx.save(_embedding(rows=5), tmp_path / "m.onnx")
    forge.from_onnx(tmp_path / "m.onnx").compile(target="host", output_path=tmp_path / "a", opt_level=1)
    np.save(tmp_path / "ids.npy", np.array([[4, 4, 3, 0, 1, 2]], np.int32))
    proc = _verify(tmp_path / "a", tmp_path / "m.onnx", "--input", f"ids={tmp_path / 'ids.npy'}")
    assert proc.returncode == 0 and "the --input arrays" in proc.stdout, proc.stderr
    np.savez(tmp_path / "ids.npz", ids=np.array([[4, 4, 3, 0, 1, 2]], np.int32))
    assert _verify(tmp_path / "a", tmp_path / "m.onnx", "--input", str(tmp_path / "ids.npz")).returncode == 0
    proc = _verify(tmp_path / "a", tmp_path / "m.onnx", "--input", f"tokens={tmp_path / 'ids.npy'}")
    assert proc.returncode == 9 and proc.stderr.count("\n") == 1 and "no input named 'tokens'" in proc.stderr
    np.save(tmp_path / "past.npy", np.array([[4, 5, 3, 0, 1, 2]], np.int32))
    for verb in ("verify", "bench"):
        proc = run_cli(verb, str(tmp_path / "a"), "--onnx", str(tmp_path / "m.onnx"), "--input",
                       f"ids={tmp_path / 'past.npy'}")
        assert proc.returncode == 9 and "Input 'ids' holds 5; it indexes a table of 5 rows" in proc.stderr, proc.stderr
    np.save(tmp_path / "short.npy", np.array([[1, 2]], np.int32))
    proc = _verify(tmp_path / "a", tmp_path / "m.onnx", "--input", f"ids={tmp_path / 'short.npy'}")
    assert proc.returncode == 9 and "Traceback" not in proc.stderr, proc.stderr
