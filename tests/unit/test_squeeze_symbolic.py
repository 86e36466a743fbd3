"""ONNX Squeeze without axes on a symbolic dimension (forgekit/importer/converters/squeeze.py).

onnxruntime removes a dimension there only when it is 1 at run time, so the output's rank depends on the size;
PLCMOS v2 (PyTorch 1.11) ends in ``squeeze()`` of a ``[batch_size, 1]`` score and declares its output with
rank 0 (traced at batch 1).  It imported as ``squeeze(x, axis=None)`` of unknown rank and failed at compile
("emit_te now only supports Tensor that has ShapeExpr shape", exit 6).  Now the declared shapes decide: rank 0
pins the symbol to 1 (other dimensions stay dynamic), a declared ``[batch]`` keeps it dynamic, and no
declaration is a one-line import error (exit 3) with advice checked by importing.  The models mirror PLCMOS's
tail: a mean over a dynamic number of frames, plus a second input of the same batch, a Gemm to one score,
Squeeze, Sigmoid, ``* 4 + 1``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from forgekit.errors import ForgekitError
from forgekit.importer import DynamicDimensionError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run, run_cli  # noqa: E402

F32 = TensorProto.FLOAT


def score_model(declared: list | None, opset: int = 13) -> onnx.ModelProto:
    """``audio[batch, frames, 8]`` -> mean over frames, + ``embed[batch, 8]`` -> Gemm to ``[batch, 1]`` ->
    Squeeze (no axes: no attribute before opset 13, one input from 13 on) -> Sigmoid -> * 4 + 1 -> ``y``
    declared as ``declared`` (None: no shape)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((1, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0.3], np.float32), "b"),
             numpy_helper.from_array(np.array(4.0, np.float32), "four"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes = [helper.make_node("ReduceMean", ["audio"], ["mean"], axes=[1], keepdims=0),
             helper.make_node("Add", ["mean", "embed"], ["h"]),
             helper.make_node("Gemm", ["h", "w", "b"], ["score"], transB=1),
             helper.make_node("Squeeze", ["score"], ["s"], name="sq"),
             helper.make_node("Sigmoid", ["s"], ["sig"]),
             helper.make_node("Mul", ["sig", "four"], ["scaled"]),
             helper.make_node("Add", ["scaled", "one"], ["y"])]
    graph = helper.make_graph(nodes, "score", [helper.make_tensor_value_info("audio", F32, ["batch", "frames", 8]),
                                               helper.make_tensor_value_info("embed", F32, ["batch", 8])],
                              [helper.make_tensor_value_info("y", F32, declared)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def feeds(batch: int, frames: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 100 + frames)
    return {"audio": rng.standard_normal((batch, frames, 8)).astype(np.float32),
            "embed": rng.standard_normal((batch, 8)).astype(np.float32)}


@pytest.mark.parametrize("opset", [11, 13])
def test_declared_scalar_pins_the_batch_to_one(opset: int, tmp_path: Path) -> None:
    """Declared rank 0: batch must be 1 (the size it was traced at), so it is pinned as --input-shape batch=1
    would pin it; frames stays dynamic.  Batch 2 (where onnxruntime returns shape (2,), against the declared
    ()) is refused by the runtime with its one-line input error, not a crash."""
    model = score_model([], opset)
    result = forgekit.from_onnx(model).compile(target="host", output_path=tmp_path / "a")
    engine = forgekit.Engine(result.path)
    assert [i["shape"] for i in engine.metadata["model"]["inputs"]] == [[1, "frames", 8], [1, 8]]
    for frames in (3, 11):
        out, expected = engine.infer(feeds(1, frames))[0], ort_run(model, feeds(1, frames))[0]
        assert out.shape == expected.shape == ()
        assert_close(out, expected)
    with pytest.raises(ForgekitError) as err:
        engine.infer(feeds(2, 3))
    assert "\n" not in str(err.value) and "audio" in str(err.value), str(err.value)


def test_declared_batch_keeps_it_dynamic(tmp_path: Path) -> None:
    """Declared ``[batch]``: the symbolic dim is kept, only static 1s go, and batch stays dynamic.  At batch 1
    onnxruntime still squeezes it (shape ()): forgekit keeps the declared rank, shape (1,), same value."""
    model = score_model(["batch"])
    result = forgekit.from_onnx(model).compile(target="host", output_path=tmp_path / "a")
    engine = forgekit.Engine(result.path)
    for batch in (2, 3):
        out, expected = engine.infer(feeds(batch, 5))[0], ort_run(model, feeds(batch, 5))[0]
        assert out.shape == expected.shape == (batch,)
        assert_close(out, expected)
    out, expected = engine.infer(feeds(1, 5))[0], ort_run(model, feeds(1, 5))[0]
    assert out.shape == (1,) and expected.shape == ()
    assert_close(out, expected.reshape(1))


def test_undeclared_rank_is_a_one_line_import_error(tmp_path: Path) -> None:
    """No declared shape says which rank: compile and inspect --check both refuse at import (exit 3, the
    dynamic-dimension class), naming the node, the dimension and a pin that was checked; nothing is written."""
    path = tmp_path / "m.onnx"
    onnx.save(score_model(None), path)
    out = tmp_path / "out"
    proc = run_cli("compile", str(path), "-o", str(out), "-t", "host")
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == DynamicDimensionError.exit_code == 3, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    for fragment in ("Squeeze node 'sq'", "[batch, 1]", "no declared shape", "--input-shape", "checked"):
        assert fragment in lines[0], lines[0]
    assert not out.exists()
    check = run_cli("inspect", str(path), "--check")
    assert check.returncode == 3 and "imports" not in check.stdout, check.stdout + check.stderr


@pytest.mark.parametrize("declared", [[1, 1], ["batch", 1]])
def test_declared_rank_neither_reading_gives_is_refused(declared: list) -> None:
    """A declared rank that neither squeezing (0) nor keeping batch (1) gives: refused at import (exit 3),
    with the advice checked by importing."""
    with pytest.raises(DynamicDimensionError, match="allow neither"):
        forgekit.from_onnx(score_model(declared))


def test_a_range_on_the_pinned_symbol_is_refused() -> None:
    """--dynamic batch=1..8 asks for sizes the declared rank 0 rules out: an error naming both, not a pin."""
    with pytest.raises(DynamicDimensionError, match="--dynamic gives batch a range"):
        forgekit.from_onnx(score_model([]), dynamic={"batch": "1..8"})
