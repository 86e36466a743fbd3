"""``MatMulInteger`` with constant 8-bit weights of either signedness and any zero point runs on forgekit's int8
matmul kernels and matches onnxruntime exactly.

onnxruntime's ``quantize_dynamic`` stores weights as uint8 by default; forgekit's fast path took int8
weights with a zero zero point only, and everything else went to TVM's int32 matmul: ddddocr's quantized
recognizer spent 9.3 ms of ~27 in one uint8 classifier (1024 x 8210, 20 rows)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from forgekit.runtime import Engine
from forgekit.runtime.cpu import host_arch, host_features

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import ort_run  # noqa: E402


def _model(w_dtype: str, zp: str):
    """y = MatMulInteger(DynamicQuantizeLinear(x), W, x_zp, w_zp) as float: the quantize_dynamic pattern."""
    rng = np.random.default_rng(3)
    k, n = 96, 80
    if w_dtype == "uint8":
        w = rng.integers(0, 256, (k, n)).astype(np.uint8)
        zps = {"none": None, "scalar": np.uint8(121), "column": rng.integers(100, 150, n).astype(np.uint8)}[zp]
    else:
        w = rng.integers(-128, 128, (k, n)).astype(np.int8)
        zps = {"none": None, "scalar": np.int8(-7), "column": rng.integers(-20, 20, n).astype(np.int8)}[zp]
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["q", "w", "qz"]
    if zps is not None:
        inits.append(numpy_helper.from_array(np.asarray(zps), "wz"))
        ins.append("wz")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]),
             helper.make_node("MatMulInteger", ins, ["acc"]),
             helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


VNNI = "avx512vnni" in host_features() and host_arch() == "x86_64"


@pytest.mark.parametrize("w_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("zp", ["none", "scalar", "column"])
def test_matches_onnxruntime_exactly_on_the_int8_kernels(tmp_path: Path, w_dtype: str, zp: str) -> None:
    model = _model(w_dtype, zp)
    result = forgekit.from_onnx(model).compile(target="host", output_path=tmp_path / "a", opt_level=3,
                                               export_metadata=True)
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    if VNNI:  # without the fix: uint8 weights or a zero point went to TVM's int32 matmul (the generic rule)
        assert list(rules.values()).count("gemm_int8_vnni") == 1, rules
    engine = Engine(result.path)
    for rows in (1, 20):
        x = np.random.default_rng(rows).standard_normal((rows, 96)).astype(np.float32)
        np.testing.assert_array_equal(engine.infer(x)[0], ort_run(model, {"x": x})[0])
