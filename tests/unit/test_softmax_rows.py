"""Softmax and LogSoftmax over the innermost axis at level 3 (backends/cpu/fast_math.py, the row rule, and
passes/long_reductions.WHOLE_ROW): one kernel that computes each exp once, with no libm call, a tail that
vectorizes, and a sum as accurate as the split one.

The class: every classifier's and recognizer's probabilities, attention's softmax, CTC heads' log_softmax over
thousands of classes.  Measured alone (2 threads, AVX-512, against onnxruntime's kernel, before -> after):
[40, 6625] 0.68 -> 0.17 ms, [40, 16000] 0.50 -> 0.39, [40, 18710] 4.0 -> 0.61 (it was split in 3 kernels),
[1536, 128] 0.17 -> 0.11.  Values are judged against onnxruntime in float64 (as test_long_reductions)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import forgekit as forge
from test_backends_cpu import _model
from test_long_reductions import assert_accurate

ROWS = {  # name: innermost length; 3 rows each
    "attention's 128": 128,
    "a CTC head's 6625 (padded to whole vectors)": 6625,
    "16000 (whole vectors)": 16000,
    "PP-OCRv6's 18710 (above LONG)": 18710,
    "WHOLE_ROW itself (2^16)": 1 << 16,
}


def _row_model(op: str, shape: list):
    return _model([helper.make_node(op, ["x"], ["y"], axis=-1)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [])


def _scheduled(model, dynamic=None) -> dict:
    """name -> TVMScript of every PrimFunc after forgekit's level-3 schedule (host target)."""
    import tvm

    from forgekit.backends.cpu.pipeline import fusion_passes
    from forgekit.backends.cpu.registry import ApplyRules
    from forgekit.passes import graph_passes

    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    mod = forge.from_onnx(model, dynamic=dynamic).mod
    with target:
        mod = tvm.ir.transform.Sequential([*graph_passes(3), *fusion_passes(target), ApplyRules(target)])(mod)
    return {gv.name_hint: f.script() for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("row", sorted(ROWS))
def test_rows_match_the_float64_result(op: str, row: str) -> None:
    """Positive values near 0.1 (every exp about equal: the sum's worst case) and spread values (one class far
    ahead, as a confident classifier's): within 1e-4 of float64 at level 3, as the split sums are."""
    n = ROWS[row]
    model = _row_model(op, [3, n])
    run = forge.from_onnx(model).get_inference_function("host", opt_level=3)
    rng = np.random.default_rng(0)
    for x in (rng.uniform(0.05, 0.15, (3, n)).astype(np.float32),
              (rng.standard_normal((3, n)) * 4).astype(np.float32)):
        assert_accurate(run(x), model, x)


def test_a_long_row_is_one_kernel_that_computes_each_exp_once() -> None:
    """[40, 18710]: above LONG (2^14), so forgekit.LongReductions split it in 3 kernels at every level; at level
    3 it is one kernel now, whose exp is a stage of its own (inlined into the sum and the normalization, each
    exp was computed twice), and whose normalization multiplies by 1 / sum instead of dividing every element."""
    funcs = _scheduled(_row_model("Softmax", [1, 40, 18710]))
    assert not any("block_" in name for name in funcs), sorted(funcs)
    (softmax,) = [code for name, code in funcs.items() if "softmax" in name]
    assert 'T.sblock("T_fast_exp")' in softmax  # materialized once per row, not inlined twice
    assert softmax.count("T.reinterpret(") == 1  # one polynomial exp in the whole kernel
    assert softmax.count("/ T_fast_exp_red[") == 1 and "T.float32(1.0) / T_fast_exp_red[" in softmax


def test_levels_below_3_still_split_a_long_row() -> None:
    """Levels 0-2 schedule nothing (one accumulator per row): the row above LONG is still summed in blocks."""
    from forgekit.passes import graph_passes

    mod = forge.from_onnx(_row_model("Softmax", [1, 40, 18710])).mod
    import tvm

    for level, split in ((2, True), (3, False)):
        out = tvm.ir.transform.Sequential(graph_passes(level))(mod)
        assert any("block_sum" in gv.name_hint for gv in out.get_global_vars()) is split, level


def test_a_padded_tail_is_a_select_and_log_softmax_calls_no_libm() -> None:
    """6625 classes pad to 6640 with the lowest float.  As ``if_then_else`` (topi.nn.pad) the padded read did not
    vectorize: 0.68 ms for the [40, 6625] softmax, 0.17 as a clamped Select.  TOPI's log_softmax called libm's
    scalar expf per element."""
    for op in ("Softmax", "LogSoftmax"):
        funcs = _scheduled(_row_model(op, [1, 40, 6625]))
        (code,) = [code for name, code in funcs.items() if "softmax" in name]
        assert "if_then_else" not in code and "T.Select(" in code, op
        assert "T.exp(" not in code, op


def test_a_symbolic_row_matches_onnxruntime() -> None:
    """A dynamic class count (no pad, one accumulator: left to the split when bounded above LONG)."""
    from conftest import ort_run

    model = _row_model("Softmax", [2, "n"])
    run = forge.from_onnx(model).get_inference_function("host", opt_level=3)
    for n in (7, 300):
        x = (np.random.default_rng(n).standard_normal((2, n)) * 3).astype(np.float32)
        np.testing.assert_allclose(run(x), ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
