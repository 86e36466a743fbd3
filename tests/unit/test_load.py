"""forgekit/importer/load.py: models whose weights are in external data files (``model.onnx.data``).

onnx's own error for a missing data file ("Data of TensorProto ... should be stored in X, but it is not
regular file") reached users as "not a valid ONNX model ...: re-export it" (issue 38.10); the model was fine,
only the file next to it was missing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from conftest import assert_close, ort_run, run_cli
from forgekit.errors import ModelLoadError
from forgekit.importer.load import load_onnx


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                              "external", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def save_external(folder: Path, location: str = "model.onnx.data") -> Path:
    """``folder/model.onnx`` with both tensors in ``folder/location``."""
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(_model(), path, save_as_external_data=True, all_tensors_to_one_file=True, location=location,
              size_threshold=0)
    assert (folder / location).is_file()
    return path


def test_external_data_next_to_the_model_is_read(tmp_path: Path) -> None:
    path = save_external(tmp_path)
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    result = forgekit.from_onnx(path).compile(target="host", output_path=tmp_path / "out")
    from forgekit.runtime import Engine

    assert_close(Engine(result.path).infer(x)[0], ort_run(path, {"x": x})[0])


@pytest.mark.parametrize("location", ["model.onnx.data", "weights/model.bin"])
def test_a_missing_data_file_is_named_with_where_it_was_looked_for(tmp_path: Path, location: str) -> None:
    path = save_external(tmp_path, location)
    (tmp_path / location).unlink()
    with pytest.raises(ModelLoadError) as err:
        load_onnx(path)
    message = str(err.value)
    assert f"'{location}'" in message and str(tmp_path / location) in message, message
    assert "'w'" in message and "'b'" in message and "re-export" not in message, message
    proc = run_cli("inspect", str(path))
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 3 and len(lines) == 1 and str(tmp_path / location) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_truncated_data_file_is_one_line(tmp_path: Path) -> None:
    path = save_external(tmp_path)
    data = tmp_path / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(ModelLoadError, match=r"only 1000 bytes: the data file is truncated"):
        load_onnx(path)


def test_bytes_with_external_data_say_to_pass_the_path(tmp_path: Path) -> None:
    path = save_external(tmp_path)
    with pytest.raises(ModelLoadError, match=r"keeps tensors 'w', 'b' in the external data file 'model.onnx.data'.*"
                                             r"pass the .onnx path"):
        load_onnx(path.read_bytes())
