"""forgekit.importer: ONNX import coverage (RNNs, quantized ops, shape-subgraph folding) and its errors.

Every conversion test goes import -> forgekit's compile (host CPU, opt_level 3, i.e. the default CPU
schedules) -> run -> compare with onnxruntime on the *original* model.  Tolerance is the suite's
(conftest.assert_close): rtol 1e-3 and atol 1e-4 x max|reference| unless a test says otherwise;
integer outputs must match exactly.

No torch and no network: small models are built with onnx.helper (onnx_models.py) or read from
tests/assets/importer/ (torch-exported, made by the prototype's make_corpus.py); the pretrained PP-OCR
models come from the ``rapidocr-onnxruntime`` wheel and are skipped when it is not installed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import forgekit
import onnx_models as M
from conftest import RTOL, ATOL, assert_close, ort_run
from forgekit.errors import ForgekitError, ModelLoadError, UnsupportedOperatorError, UsageError
from forgekit.importer import (
    DYNAMIC_INPUT,
    ConversionError,
    DynamicShapeError,
    ImportErrorBase,
    PrepareError,
    UnsupportedOperatorsError,
    check_report,
    find_unsupported,
    import_onnx,
    prepare_onnx,
)
from forgekit.importer.prepare import graph_inputs, value_shape

HERE = Path(__file__).resolve().parents[1]
ASSET_DIR = HERE / "assets" / "importer"


# ------------------------------------------------------------------------------------ helpers
def make_inputs(model: onnx.ModelProto, seed: int = 0, int_high: int = 100) -> dict[str, np.ndarray]:
    """Seeded inputs for a model whose inputs are static: floats ~ N(0, 1), ints ~ U[0, int_high)."""
    rng = np.random.default_rng(seed)
    out = {}
    for vi in graph_inputs(model):
        shape = value_shape(vi)
        assert shape is not None and all(isinstance(d, int) for d in shape), f"{vi.name} is not static: {shape}"
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        if dtype.kind == "f":
            out[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            out[vi.name] = rng.integers(0, int_high, size=shape).astype(dtype)
        else:
            out[vi.name] = np.ones(shape, dtype=dtype)
    return out


def compile_fn(mod: Any, opt_level: int = 3) -> Callable[..., Any]:
    """forgekit's in-memory build of a Relax module (or IRModule) for this CPU (default: opt_level 3)."""
    ir = mod if isinstance(mod, forgekit.IRModule) else forgekit.IRModule(mod)
    return ir.get_inference_function("host", opt_level=opt_level)


def run(fn: Callable[..., Any], arrays: list[np.ndarray]) -> list[np.ndarray]:
    out = fn(*arrays)
    return [out] if isinstance(out, np.ndarray) else list(out)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    names = {vi.name for vi in graph_inputs(model)}
    return [np.asarray(o) for o in ort_run(model, {k: v for k, v in feeds.items() if k in names})]


@dataclasses.dataclass
class Result:
    max_abs: float
    max_rel: float  # max |got - ref| / max |ref| over outputs
    outputs: int


def compare(got: list[np.ndarray], ref: list[np.ndarray], rtol: float = RTOL, atol: float = ATOL,
            abs_atol: float | None = None) -> Result:
    """assert_close on every output (exact for integer outputs when atol == 0); returns the errors.

    ``abs_atol`` replaces the scaled atol with an absolute one (for probability outputs near zero).
    """
    assert len(got) == len(ref), f"{len(got)} outputs vs {len(ref)}"
    max_abs = max_rel = 0.0
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape, f"output {i}: shape {g.shape} vs {r.shape}"
        if r.size == 0:
            continue
        if r.dtype.kind in "iub" and atol == 0:
            np.testing.assert_array_equal(g, r, err_msg=f"output {i}")
        elif abs_atol is not None:
            np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), rtol=rtol, atol=abs_atol)
        else:
            assert_close(g.astype(np.float64), r.astype(np.float64), rtol=rtol, atol=atol)
        diff = float(np.max(np.abs(g.astype(np.float64) - r.astype(np.float64))))
        scale = float(np.max(np.abs(r.astype(np.float64))))
        max_abs, max_rel = max(max_abs, diff), max(max_rel, diff / scale if scale else diff)
    return Result(max_abs, max_rel, len(ref))


def check(model: Any, shape_dict: dict | None = None, inputs_fn: Callable | None = None, rtol: float = RTOL,
          atol: float = ATOL, opt_level: int = 3, abs_atol: float | None = None, **import_kwargs: Any) -> Result:
    """Import, compile with forgekit (``opt_level``), run, compare with onnxruntime on the original model.

    Without ``import_kwargs`` the import is the product path, ``forgekit.from_onnx`` (unpinned dims
    stay symbolic); with them (``freeze``...) it is :func:`forgekit.importer.import_onnx`.
    """
    model = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    if import_kwargs:
        fn = compile_fn(import_onnx(model, shape_dict, **import_kwargs).mod, opt_level)
    else:
        fn = compile_fn(forgekit.from_onnx(model, shape_dict), opt_level)
    # static input shapes to feed (a dim left symbolic at import is fed with the batch default, 1)
    freeze = import_kwargs.get("freeze") or {}
    prepared = prepare_onnx(model, shape_dict, fold=False, freeze=freeze)
    inputs = inputs_fn(prepared) if inputs_fn else make_inputs(prepared)
    got = run(fn, [inputs[vi.name] for vi in graph_inputs(prepared)])
    feeds = dict(inputs)
    types = {vi.name: vi.type.tensor_type for vi in model.graph.input}
    for name, value in freeze.items():
        arr = np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(types[name].elem_type))
        feeds[name] = arr.reshape([d.dim_value for d in types[name].shape.dim])
    return compare(got, run_ort(model, feeds), rtol, atol, abs_atol)


def _u8(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=shape).astype(np.uint8)


# ------------------------------------------------------------------------------------ RNNs
# opt_level 3 = forgekit's default CPU schedules.  Hidden size 3 is deliberately not a multiple of the
# vector width: it once exposed a miscompile (an epilogue vectorized across a reduction's serial loop).
RNN_OPT_LEVEL = 3

RNN_CASES = {
    "lstm_fwd": dict(kind="LSTM"),
    "lstm_bi_peephole": dict(kind="LSTM", direction="bidirectional", peephole=True),
    "lstm_rev_seqlens_input": dict(kind="LSTM", direction="reverse", seq_lens="input"),
    "lstm_bi_seqlens_const": dict(kind="LSTM", direction="bidirectional", seq_lens=[3, 5]),
    "lstm_noinit_nobias": dict(kind="LSTM", with_bias=False, with_init=False),
    "lstm_input_forget_clip": dict(kind="LSTM", input_forget=1, clip=0.5),
    "lstm_only_yh": dict(kind="LSTM", outputs=("", "Y_h")),
    "gru_fwd": dict(kind="GRU"),
    "gru_lbr_bi_seqlens": dict(kind="GRU", direction="bidirectional", lbr=1, seq_lens="input"),
    "gru_reverse": dict(kind="GRU", direction="reverse"),
    "gru_activations": dict(kind="GRU", activations=["HardSigmoid", "LeakyRelu"]),
    "rnn_bi": dict(kind="RNN", direction="bidirectional"),
    "rnn_relu": dict(kind="RNN", activations=["Relu"]),
}


def _rnn_inputs(pm):
    d = make_inputs(pm, 0)
    if "seq_lens" in d:
        d["seq_lens"] = np.array([2, 5], np.int32)
    return d


@pytest.mark.parametrize("case", sorted(RNN_CASES))
def test_rnn_ops(case):
    check(M.rnn_model(**RNN_CASES[case]), inputs_fn=_rnn_inputs, opt_level=RNN_OPT_LEVEL)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_rnn_small_hidden_size_at_opt_level_2(kind):
    """The stock (unscheduled) lowering path gives the same answers."""
    check(M.rnn_model(kind), opt_level=2)


def test_rnn_hidden_size_16_at_opt_level_3():
    check(M.rnn_model("LSTM", "bidirectional", H=16, I=12, peephole=True), opt_level=3)
    check(M.rnn_model("GRU", "bidirectional", H=16, I=12, lbr=1, seq_lens="input"), inputs_fn=_rnn_inputs,
          opt_level=3)


def test_rnn_dynamic_batch_pinned_by_symbol():
    ir = forgekit.from_onnx(M.rnn_model("GRU", dynamic_batch=True), {"N": 3})
    assert ir.input_shapes == [(5, 3, 4), (1, 3, 3)]
    check(M.rnn_model("GRU", dynamic_batch=True), {"N": 3}, opt_level=RNN_OPT_LEVEL)


def test_rnn_symbolic_batch_stays_symbolic():
    """forgekit.from_onnx keeps an unpinned batch symbolic; the unrolled RNN runs at any batch."""
    model = M.rnn_model("LSTM", dynamic_batch=True)
    ir = forgekit.from_onnx(model)
    assert ir.input_shapes[0] == (5, "N", 4)
    fn = compile_fn(ir, RNN_OPT_LEVEL)
    for n in (1, 3):
        feeds = make_inputs(prepare_onnx(model, {"N": n}, fold=False), seed=n)
        compare(run(fn, [feeds[k] for k in ("X", "h0", "c0")]), run_ort(model, feeds))


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_rnn_layout1(kind):
    """onnxruntime has no layout=1: compare with the layout=0 model on transposed tensors."""
    m1 = M.rnn_model(kind, "bidirectional", layout=1, peephole=(kind == "LSTM"))
    m0 = M.rnn_model(kind, "bidirectional", layout=0, peephole=(kind == "LSTM"))
    fn = compile_fn(forgekit.from_onnx(m1), RNN_OPT_LEVEL)
    feeds1 = make_inputs(m1, 0)
    got = run(fn, [feeds1[vi.name] for vi in graph_inputs(m1)])
    ref0 = run_ort(m0, {k: np.ascontiguousarray(np.swapaxes(v, 0, 1)) for k, v in feeds1.items()})
    ref = [np.transpose(ref0[0], (2, 0, 1, 3))] + [np.swapaxes(r, 0, 1) for r in ref0[1:]]
    compare(got, ref)


def test_if_selecting_lstm_branch_is_inlined():
    m = M.if_lstm_model()
    p = prepare_onnx(m, {"N": 2})
    assert [n.op_type for n in p.graph.node if n.op_type in ("If", "LSTM", "GRU")] == ["LSTM"]
    check(m, {"N": 2}, opt_level=RNN_OPT_LEVEL)


# ------------------------------------------------------------------------------------ quantized
def _u8_inputs(pm):
    return {vi.name: _u8([d.dim_value for d in vi.type.tensor_type.shape.dim]) for vi in pm.graph.input}


@pytest.mark.parametrize(
    "name,builder",
    [
        ("conv_integer", lambda: M.conv_integer_model()),
        ("conv_integer_nozp", lambda: M.conv_integer_model(with_zp=False)),
        ("qlinear_conv_per_channel", lambda: M.qlinear_conv_model()),
        ("qlinear_conv_per_tensor_stride2", lambda: M.qlinear_conv_model(per_channel=False, strides=(2, 2))),
        ("qlinear_conv_grouped", lambda: M.qlinear_conv_model(group=2)),
        ("qlinear_conv_depthwise", lambda: M.qlinear_conv_model(group=4)),
        ("qlinear_matmul", lambda: M.qlinear_matmul_model()),
        ("matmul_integer", lambda: M.matmul_integer_model()),
    ],
)
def test_quantized_ops(name, builder):
    r = check(builder(), inputs_fn=_u8_inputs, atol=0)
    assert r.max_abs == 0  # integer outputs must match exactly


def test_conv_integer_per_channel_zero_point_vs_onnx_reference():
    """onnxruntime rejects a per-channel w_zero_point; check against onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    m = M.conv_integer_model(per_channel=True)
    x = _u8((1, 4, 9, 9))
    ref = ReferenceEvaluator(m).run(None, {"x": x})[0]
    got = run(compile_fn(forgekit.from_onnx(m)), [x])
    np.testing.assert_array_equal(got[0], ref)


# ------------------------------------------------------------------------------------ graph patterns
def test_detector_head_anchor_grid():
    m = M.detector_head()
    p = prepare_onnx(m, {"x": [2, 16, 8, 10]})
    assert not {"Shape", "Range", "Expand"} & {n.op_type for n in p.graph.node}
    check(m, {"x": [2, 16, 8, 10]})


def test_old_style_initializers_as_inputs_opset9():
    m = M.old_style_model()
    p = prepare_onnx(m)  # N defaults to 1 in the importer's own API
    assert [i.name for i in p.graph.input] == ["x"]
    assert p.opset_import[0].version >= 11
    check(m, {"N": 1})
    ir = forgekit.from_onnx(m)  # forgekit keeps N symbolic
    assert ir.input_names == ["x"] and ir.input_shapes == [("N", 3, 8, 8)]


def test_zero_d_constant_of_shape_mask():
    m = M.constant_of_shape_mask_model()
    p = prepare_onnx(m, {"b": 2, "s": 6})
    assert "ConstantOfShape" not in {n.op_type for n in p.graph.node}
    mask = np.array([[1, 1, 1, 1, 0, 0], [1] * 6])
    check(m, {"b": 2, "s": 6}, inputs_fn=lambda pm: dict(make_inputs(pm, 0), mask=mask))


def test_freeze_scalar_input():
    n = helper.make_node
    g = helper.make_graph(
        [n("Mul", ["x", "k"], ["y"], name="mul")], "f",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    p = prepare_onnx(m, freeze={"k": 2.5})
    assert [i.name for i in p.graph.input] == ["x"]
    check(m, freeze={"k": 2.5})


def test_keep_params_in_input_passthrough():
    mod = import_onnx(M.rnn_model("LSTM"), keep_params_in_input=True).mod
    assert [p.name for p in mod["main"].params][:3] == ["X", "h0", "c0"]
    assert int(mod["main"].attrs["num_input"]) == 3


# ------------------------------------------------------------------------------------ pre-flight check
def test_find_unsupported_lists_every_node_and_dynamic_inputs():
    m = M.unsupported_model()
    m.graph.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, "len"]))
    found = find_unsupported(m)
    assert ("Det", "det_1") in found
    assert ("StringNormalizer", "strnorm") in found
    assert ("my.domain.MyOp", "custom_1") in found
    assert (DYNAMIC_INPUT, "z[1, len]") in found
    assert not any(f.op_type == "Relu" for f in found)
    assert find_unsupported(m, {"len": 4}) == [f for f in found if f.op_type != DYNAMIC_INPUT]
    # findings are (op, node) tuples; check_report validates a shape_dict against the model like from_onnx
    assert find_unsupported(m) == [tuple(f) for f in found]
    assert find_unsupported(m, {"z": [1, 4]}) == [tuple(f) for f in found if f.op_type != DYNAMIC_INPUT]
    with pytest.raises(UsageError, match="model's inputs are"):
        check_report(m, {"nope": [1]})


def test_find_unsupported_looks_into_subgraphs_and_names_unnamed_nodes():
    n = helper.make_node
    then_g = helper.make_graph([n("Det", ["x"], ["d"])], "then", [], [helper.make_tensor_value_info("d", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([n("Identity", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    g = helper.make_graph(
        [n("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="if0")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    assert find_unsupported(m) == [("Det", "Det_0")]
    (then_branch,) = [a.g for a in prepare_onnx(m).graph.node[0].attribute if a.name == "then_branch"]
    assert then_branch.node[0].name == "Det_0"  # the name import errors use


def test_find_unsupported_empty_for_rnn_and_quant_models():
    for m in (M.rnn_model("LSTM"), M.qlinear_conv_model(), M.if_lstm_model()):
        assert [f for f in find_unsupported(m, {"N": 2}) if f.op_type != DYNAMIC_INPUT] == []


def test_check_report(tmp_path):
    m = M.unsupported_model()
    m.graph.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, "len"]))
    path = tmp_path / "u.onnx"
    onnx.save(m, path)
    report = check_report(path, None)
    assert set(report) == {"unsupported", "dynamic_inputs"}
    assert report["unsupported"] == [{"op": "Det", "node": "det_1"}, {"op": "StringNormalizer", "node": "strnorm"},
                                     {"op": "my.domain.MyOp", "node": "custom_1"}]
    # x is [n, 3, 3]: a symbolic leading (batch) dim is not reported; z's second dim is
    assert report["dynamic_inputs"] == [{"name": "z", "shape": [1, "len"]}]
    assert check_report(m, {"z": [1, 4]})["dynamic_inputs"] == []
    assert check_report(m, {"len": 4})["dynamic_inputs"] == []
    json.dumps(report)  # JSON-ready
    ok = check_report(M.rnn_model("LSTM", dynamic_batch=True), {"N": 2})
    assert ok == {"unsupported": [], "dynamic_inputs": []}
    with pytest.raises(UsageError, match="model's inputs are"):
        check_report(m, {"nope": [1]})
    with pytest.raises(ModelLoadError, match="does not exist"):
        check_report(tmp_path / "missing.onnx")


# ------------------------------------------------------------------------------------ errors
def test_error_classes_are_forgekit_errors():
    assert issubclass(ImportErrorBase, ModelLoadError)
    assert issubclass(UnsupportedOperatorsError, UnsupportedOperatorError) and UnsupportedOperatorsError.exit_code == 4
    assert issubclass(ConversionError, UnsupportedOperatorError) and ConversionError.exit_code == 4
    assert issubclass(DynamicShapeError, ModelLoadError) and DynamicShapeError.exit_code == 3
    assert issubclass(PrepareError, ModelLoadError) and PrepareError.exit_code == 3
    for cls in (ImportErrorBase, UnsupportedOperatorsError, ConversionError, DynamicShapeError, PrepareError):
        assert issubclass(cls, ForgekitError)


def test_import_raises_one_error_with_all_unsupported_ops():
    with pytest.raises(UnsupportedOperatorsError) as ei:
        import_onnx(M.unsupported_model(), {"n": 1})
    e = ei.value
    assert isinstance(e, ImportErrorBase) and isinstance(e, UnsupportedOperatorError)
    assert {op for op, _ in e.ops} == {"Det", "StringNormalizer", "my.domain.MyOp"}
    assert "3 unsupported operator type(s)" in str(e) and "Det (det_1)" in str(e) and "\n" not in str(e)


def test_from_onnx_lists_unsupported_ops_with_the_path(tmp_path):
    path = tmp_path / "u.onnx"
    onnx.save(M.unsupported_model(), path)
    with pytest.raises(UnsupportedOperatorError) as ei:
        forgekit.from_onnx(path)
    msg = str(ei.value)
    assert msg.startswith(f"'{path}' uses 3 unsupported operator type(s): Det (det_1); StringNormalizer (strnorm); "
                          "my.domain.MyOp (custom_1).") and ei.value.exit_code == 4


def test_dynamic_shape_error_lists_inputs():
    """prepare_onnx without allow_dynamic (the strict mode of the importer's own API) lists every input."""
    m = M.rnn_model("LSTM", dynamic_batch=True)  # X: [T, N, I], h0/c0: [1, N, H]
    with pytest.raises(DynamicShapeError) as ei:
        prepare_onnx(m, default_batch=None)
    msg = str(ei.value)
    assert "X[5, N, 4]" in msg and "h0[" in msg and "\n" not in msg and "--input-shape" in msg
    assert {n for n, _ in ei.value.inputs} == {"X", "h0", "c0"}
    assert ei.value.exit_code == 3


def test_bad_shape_dict():
    with pytest.raises(PrepareError, match="contradicts the model's static size 16"):
        prepare_onnx(M.detector_head(), {"x": [1, 8, 8, 10]})  # C is 16 in the model
    with pytest.raises(PrepareError, match="neither a graph input"):
        prepare_onnx(M.detector_head(), {"nope": [1]})
    # forgekit.from_onnx: usage errors (exit 2); a static dim may be replaced (set_batch_size relies on it)
    with pytest.raises(UsageError, match="has 3 dimension"):
        forgekit.from_onnx(M.detector_head(), {"x": [1, 16, 8]})
    with pytest.raises(UsageError, match="dimension symbol 'N': give an int"):
        forgekit.from_onnx(M.rnn_model("GRU", dynamic_batch=True), {"N": "many"})


def _run_time_pads_model(batch: int | str = 2) -> onnx.ModelProto:
    """Pad by widths given at run time: TVM's converter takes constant pads only.  (A Reshape to input values was
    this example until it imported: tests/unit/test_value_shapes.py.)"""
    n = helper.make_node
    g = helper.make_graph(
        [n("Cast", ["s"], ["s64"], name="cast", to=TensorProto.INT64),
         n("Pad", ["x", "s64"], ["y"], name="run_time_pads")],
        "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 6]),
         helper.make_tensor_value_info("s", TensorProto.INT32, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m


def test_tvm_failure_is_one_line_and_names_node(tmp_path):
    """A Pad whose widths are data: TVM refuses; the error names the node."""
    with pytest.raises(ConversionError) as ei:
        import_onnx(_run_time_pads_model())
    msg = str(ei.value)
    assert "Pad" in msg and "run_time_pads" in msg and "open an issue" in msg
    assert "\n" not in msg and "Traceback" not in msg
    path = tmp_path / "r.onnx"
    onnx.save(_run_time_pads_model(), path)
    with pytest.raises(UnsupportedOperatorError) as ei:  # through forgekit: exit code 4, the file named
        forgekit.from_onnx(path)
    assert f"Pad node 'run_time_pads' of '{path}'" in str(ei.value) and ei.value.exit_code == 4


def test_conversion_failure_with_dynamic_inputs_says_to_pin_them():
    """An unrolled RNN (peepholes: not the loop kernel's) needs a static sequence length: forgekit.from_onnx
    keeps 'T' symbolic, and says to pin it.  (The loop kernel takes a symbolic 'T': test_recurrence.py.)"""
    m = M.rnn_model("LSTM", peephole=True)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    with pytest.raises(ConversionError) as ei:
        forgekit.from_onnx(m)
    msg = str(ei.value)
    assert "LSTM node 'lstm0'" in msg and "X[T, 2, 4]" in msg and "--input-shape X=1x2x4" in msg
    assert "\n" not in msg
    forgekit.from_onnx(m, {"T": 5})  # pinned: imports


def test_converter_exception_wrapped():
    from forgekit.importer.converters.rnn import LSTM

    class Broken(LSTM):
        @classmethod
        def _convert(cls, bb, inputs, attr):
            raise RuntimeError("boom\nsecond line")

    with pytest.raises(ConversionError) as ei:
        import_onnx(M.rnn_model("LSTM"), extra_converters={"LSTM": Broken})
    assert ei.value.node_name == "lstm0" and ei.value.op_type == "LSTM"
    assert "\n" not in str(ei.value) and "RuntimeError" in str(ei.value)


def test_frontend_restored_after_import():
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    import_onnx(M.rnn_model("RNN"))
    assert "LSTM" not in fe._get_convert_map()
    assert {"LSTM", "GRU", "RNN", "QLinearConv", "ConvInteger"} <= forgekit.importer.supported_op_types()


def test_importing_the_package_needs_neither_tvm_nor_onnxruntime():
    import subprocess
    import sys

    code = ("import sys, forgekit.importer as fi; fi.find_unsupported; fi.check_report; "
            "print('tvm' in sys.modules, 'onnxruntime' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"


# ------------------------------------------------------------------------------------ corpus assets
ASSETS = json.loads((ASSET_DIR / "manifest.json").read_text())


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_corpus_asset(name):
    e = ASSETS[name]
    check(ASSET_DIR / e["file"], e.get("shape_dict"), rtol=e.get("rtol", RTOL), atol=e.get("atol", ATOL))


def test_lstm_asset_end_to_end_artifact(tmp_path):
    """forgekit.from_onnx -> compile(target="host") -> runtime.Engine on a torch-exported 2-layer BiLSTM."""
    from forgekit.runtime import Engine

    e = ASSETS["lstm_bi_bf_2l_state_torchscript"]
    path = ASSET_DIR / e["file"]
    ir = forgekit.from_onnx(path, e["shape_dict"])
    assert "LSTM" not in str(ir.operators) and ir.input_names == ["x", "h0", "c0"]
    result = ir.compile(target="host", output_path=tmp_path / "lstm")
    engine = Engine(result.path)
    rng = np.random.default_rng(5)
    feeds = {name: rng.standard_normal(e["shape_dict"][name]).astype(np.float32) for name in ir.input_names}
    outputs = engine.infer(feeds)
    expected = ort_run(path, feeds)
    assert len(outputs) == len(expected) == 3 and engine.output_names == ir.output_names
    for got, ref in zip(outputs, expected):
        assert_close(got, ref, rtol=1e-3, atol=1e-4)


# ------------------------------------------------------------------------------------ pretrained PP-OCR
def _rapidocr_model(fname):
    # find_spec does not import the package (whose __init__ needs opencv): ./dev.sh installs the wheel
    # with --no-deps for its models only.
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr-onnxruntime is not installed (./dev.sh test installs it)")
    p = Path(list(spec.submodule_search_locations)[0]) / "models" / fname
    if not p.exists():
        pytest.skip(f"{p} not shipped with this rapidocr_onnxruntime")
    return str(p)


def _text_image(pm, seed=0):
    """A synthetic 'text line' image (dark strokes on light paper), normalised as PP-OCR expects.

    Random noise makes the detector output an all-but-zero probability map; strokes give it structure.
    """
    (vi,) = graph_inputs(pm)
    n, c, h, w = value_shape(vi)
    rng = np.random.default_rng(seed)
    img = np.full((n, c, h, w), 235.0, np.float32) + rng.normal(0, 6, (n, c, h, w)).astype(np.float32)
    for _ in range(max(3, w // 12)):
        y0, x0 = int(rng.integers(h // 4, max(h // 4 + 1, 3 * h // 4 - 2))), int(rng.integers(0, w - 4))
        img[:, :, y0:y0 + max(2, h // 6), x0:x0 + int(rng.integers(2, 6))] = 25.0
    return {vi.name: ((img / 255.0 - 0.5) / 0.5).astype(np.float32)}


@pytest.mark.parametrize(
    "fname,shape,abs_atol",
    [
        ("ch_ppocr_mobile_v2.0_cls_infer.onnx", [1, 3, 48, 192], None),
        ("ch_PP-OCRv4_rec_infer.onnx", [1, 3, 48, 160], None),
        # The detector's output is a probability map whose maximum is ~5e-6 on this synthetic image;
        # onnxruntime's (MLAS) logistic returns exact 0 far below that where forgekit's returns 1e-8:
        # compare probabilities with an absolute tolerance of 1e-6 instead of one scaled by the maximum.
        ("ch_PP-OCRv4_det_infer.onnx", [1, 3, 96, 96], 1e-6),
    ],
)
def test_ppocr_pretrained(fname, shape, abs_atol):
    path = _rapidocr_model(fname)
    r = check(path, {"x": shape}, inputs_fn=_text_image, abs_atol=abs_atol)
    assert r.outputs == 1


def test_ppocr_needs_prepare():
    """Stock from_onnx fails on the PP-OCR classifier's flatten pattern; the importer's prepare fixes it."""
    import contextlib
    import io
    import warnings

    from tvm.relax.frontend.onnx import from_onnx

    m = onnx.load(_rapidocr_model("ch_ppocr_mobile_v2.0_cls_infer.onnx"))
    with pytest.raises(Exception), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_onnx(m, shape_dict={"x": [1, 3, 48, 192]})
    import_onnx(m, {"x": [1, 3, 48, 192]})


@pytest.fixture(scope="module")
def cls_prepared(tmp_path_factory):
    path = _rapidocr_model("ch_ppocr_mobile_v2.0_cls_infer.onnx")
    out = tmp_path_factory.mktemp("q") / "cls_pre.onnx"
    onnx.save(prepare_onnx(onnx.load(path), {"x": [1, 3, 48, 192]}), str(out))
    return out


def test_ppocr_cls_ort_dynamic_quant(cls_prepared, tmp_path):
    """quantize_dynamic -> DynamicQuantizeLinear + ConvInteger + MatMulInteger."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    q = tmp_path / "qdyn.onnx"
    quantize_dynamic(str(cls_prepared), str(q), weight_type=QuantType.QUInt8, op_types_to_quantize=["Conv", "MatMul"])
    assert "ConvInteger" in {n.op_type for n in onnx.load(str(q)).graph.node}
    # onnxruntime's DynamicQuantizeLinear rounding can flip one activation quantum: compare loosely
    check(q, rtol=0.05, atol=0.02)


def test_ppocr_cls_ort_qoperator_quant(cls_prepared, tmp_path):
    """quantize_static(QOperator) -> QLinearConv, QLinearAdd/Mul, QGemm, QLinearSoftmax, ..."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.it = iter([{"x": rng.standard_normal((1, 3, 48, 192)).astype(np.float32)} for _ in range(2)])

        def get_next(self):
            return next(self.it, None)

    q = tmp_path / "qop.onnx"
    quantize_static(str(cls_prepared), str(q), Reader(), quant_format=QuantFormat.QOperator,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
    assert {"QLinearConv", "QLinearAdd"} <= {n.op_type for n in onnx.load(str(q)).graph.node}
    check(q, rtol=0.05, atol=0.02)
