"""Import-coverage tests: import -> compile (llvm znver4, default pipeline) -> run -> compare with onnxruntime.

No torch and no network: small models are built with onnx.helper (tests/onnx_models.py) or
read from tests/assets/ (made by make_corpus.py); the pretrained PP-OCR models come from the
``rapidocr-onnxruntime`` wheel when it is installed (skipped otherwise).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import onnx_models as M  # noqa: E402

from importer import (  # noqa: E402
    DYNAMIC_INPUT,
    ConversionError,
    DynamicShapeError,
    ImportErrorBase,
    PrepareError,
    UnsupportedOperatorsError,
    find_unsupported,
    import_onnx,
    prepare_onnx,
)
from importer.verify import compare, compile_module, make_inputs, run_ort, run_tvm, verify  # noqa: E402

RTOL, ATOL = 1e-3, 1e-4


def _check(model, shape_dict=None, inputs_fn=None, rtol=RTOL, atol=ATOL, **kw):
    r = verify(model, shape_dict, input_fn=inputs_fn, rtol=rtol, atol=atol, **kw)
    assert r.ok, r.summary()
    return r


def _u8(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=shape).astype(np.uint8)


# ------------------------------------------------------------------------------------ RNNs
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
    _check(M.rnn_model(**RNN_CASES[case]), inputs_fn=_rnn_inputs)


def test_rnn_dynamic_batch_pinned_by_symbol():
    _check(M.rnn_model("GRU", dynamic_batch=True), {"N": 3})


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_rnn_layout1(kind):
    """onnxruntime has no layout=1: compare with the layout=0 model on transposed tensors."""
    direction = "bidirectional"
    m1 = M.rnn_model(kind, direction, layout=1, peephole=(kind == "LSTM"))
    m0 = M.rnn_model(kind, direction, layout=0, peephole=(kind == "LSTM"))
    ex = compile_module(import_onnx(m1))
    feeds1 = make_inputs(m1, 0)
    got, _ = run_tvm(ex, m1, feeds1)
    feeds0 = {k: np.ascontiguousarray(np.swapaxes(v, 0, 1)) for k, v in feeds1.items()}
    ref0 = run_ort(m0, feeds0)
    ref = [np.transpose(ref0[0], (2, 0, 1, 3))] + [np.swapaxes(r, 0, 1) for r in ref0[1:]]
    ok, ma, _, detail = compare(got, ref, RTOL, ATOL)
    assert ok, detail


def test_if_selecting_lstm_branch_is_inlined():
    m = M.if_lstm_model()
    p = prepare_onnx(m, {"N": 2})
    assert [n.op_type for n in p.graph.node if n.op_type in ("If", "LSTM", "GRU")] == ["LSTM"]
    _check(m, {"N": 2})


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
    r = _check(builder(), inputs_fn=_u8_inputs, atol=0)
    assert r.max_abs == 0  # integer outputs must match exactly


# ------------------------------------------------------------------------------------ graph patterns
def test_detector_head_anchor_grid():
    m = M.detector_head()
    p = prepare_onnx(m, {"x": [2, 16, 8, 10]})
    assert not {"Shape", "Range", "Expand"} & {n.op_type for n in p.graph.node}
    _check(m, {"x": [2, 16, 8, 10]})


def test_old_style_initializers_as_inputs_opset9():
    m = M.old_style_model()
    p = prepare_onnx(m)  # N defaults to 1
    assert [i.name for i in p.graph.input] == ["x"]
    assert p.opset_import[0].version >= 11
    _check(m)


def test_zero_d_constant_of_shape_mask():
    m = M.constant_of_shape_mask_model()
    p = prepare_onnx(m, {"b": 2, "s": 6})
    assert "ConstantOfShape" not in {n.op_type for n in p.graph.node}
    _check(m, {"b": 2, "s": 6}, inputs_fn=lambda pm: dict(make_inputs(pm, 0), mask=np.array([[1, 1, 1, 1, 0, 0], [1] * 6])))


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
    _check(m, freeze={"k": 2.5})


# ------------------------------------------------------------------------------------ errors
def test_find_unsupported_lists_every_node_and_dynamic_inputs():
    m = M.unsupported_model()
    vi = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, "len"])
    m.graph.input.append(vi)
    found = find_unsupported(m)
    assert ("Det", "det_1") in found
    assert ("StringNormalizer", "strnorm") in found
    assert ("my.domain::MyOp", "custom_1") in found
    assert (DYNAMIC_INPUT, "z[1, len]") in found
    assert not any(f.op_type == "Relu" for f in found)
    assert find_unsupported(m, {"len": 4}) == [f for f in found if f.op_type != DYNAMIC_INPUT]


def test_find_unsupported_empty_for_rnn_and_quant_models():
    for m in (M.rnn_model("LSTM"), M.qlinear_conv_model(), M.if_lstm_model()):
        assert [f for f in find_unsupported(m, {"N": 2}) if f.op_type != DYNAMIC_INPUT] == []


def test_import_raises_one_error_with_all_unsupported_ops():
    with pytest.raises(UnsupportedOperatorsError) as ei:
        import_onnx(M.unsupported_model())
    e = ei.value
    assert isinstance(e, ImportErrorBase)
    assert {op for op, _ in e.ops} == {"Det", "StringNormalizer", "my.domain::MyOp"}
    assert "det_1" in str(e) and "\n" not in str(e)


def test_dynamic_shape_error_lists_inputs():
    m = M.rnn_model("LSTM", dynamic_batch=True)  # X: [T, N, I], h0/c0: [1, N, H]
    with pytest.raises(DynamicShapeError) as ei:
        import_onnx(m)
    msg = str(ei.value)
    assert "X[5, N, 4]" in msg and "h0[" in msg and "\n" not in msg
    assert {n for n, _ in ei.value.inputs} == {"X", "h0", "c0"}


def test_bad_shape_dict():
    with pytest.raises(PrepareError):
        prepare_onnx(M.detector_head(), {"x": [1, 8, 8, 10]})  # C is 16 in the model
    with pytest.raises(PrepareError):
        prepare_onnx(M.detector_head(), {"nope": [1]})


def test_tvm_failure_is_one_line_and_names_node():
    """Reshape whose target shape is computed from data: TVM refuses; error names the node."""
    n = helper.make_node
    g = helper.make_graph(
        [n("Cast", ["s"], ["s64"], name="cast", to=TensorProto.INT64),
         n("Reshape", ["x", "s64"], ["y"], name="data_dependent_reshape")],
        "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
         helper.make_tensor_value_info("s", TensorProto.INT32, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    with pytest.raises(ConversionError) as ei:
        import_onnx(m)
    msg = str(ei.value)
    assert "Reshape" in msg and "data_dependent_reshape" in msg
    assert "\n" not in msg and "Traceback" not in msg


def test_converter_exception_wrapped():
    from importer.converters.rnn import LSTM

    class Broken(LSTM):
        @classmethod
        def _convert(cls, bb, inputs, attr):
            raise RuntimeError("boom\nsecond line")

    with pytest.raises(ConversionError) as ei:
        import_onnx(M.rnn_model("LSTM"), extra_converters={"LSTM": Broken})
    assert ei.value.node_name == "lstm0" and ei.value.op_type == "LSTM"
    assert "\n" not in str(ei.value)


def test_frontend_restored_after_import():
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    import_onnx(M.rnn_model("RNN"))
    assert "LSTM" not in fe._get_convert_map()


# ------------------------------------------------------------------------------------ corpus assets
ASSET_MANIFEST = HERE / "assets" / "manifest.json"
ASSETS = json.loads(ASSET_MANIFEST.read_text()) if ASSET_MANIFEST.exists() else {}


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_corpus_asset(name):
    e = ASSETS[name]
    _check(str(HERE / "assets" / e["file"]), e.get("shape_dict"), rtol=e.get("rtol", RTOL), atol=e.get("atol", ATOL))


# ------------------------------------------------------------------------------------ pretrained PP-OCR
def _rapidocr_model(fname):
    mod = pytest.importorskip("rapidocr_onnxruntime")
    p = Path(mod.__file__).parent / "models" / fname
    if not p.exists():
        pytest.skip(f"{p} not shipped")
    return str(p)


@pytest.mark.parametrize(
    "fname,shape",
    [
        ("ch_ppocr_mobile_v2.0_cls_infer.onnx", [1, 3, 48, 192]),
        ("ch_PP-OCRv4_rec_infer.onnx", [1, 3, 48, 160]),
        ("ch_PP-OCRv4_det_infer.onnx", [1, 3, 96, 96]),
    ],
)
def test_ppocr_pretrained(fname, shape):
    path = _rapidocr_model(fname)
    r = _check(path, {"x": shape})
    assert r.outputs == 1


def test_ppocr_needs_prepare():
    """Stock from_onnx fails on the PP-OCR classifier's flatten pattern; prepare fixes it."""
    from tvm.relax.frontend.onnx import from_onnx

    path = _rapidocr_model("ch_ppocr_mobile_v2.0_cls_infer.onnx")
    m = onnx.load(path)
    import contextlib
    import io
    import warnings

    with pytest.raises(Exception), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_onnx(m, shape_dict={"x": [1, 3, 48, 192]})
    import_onnx(m, {"x": [1, 3, 48, 192]})


# ------------------------------------------------------------------------------------ ORT-quantized PP-OCR
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
    ops = {n.op_type for n in onnx.load(str(q)).graph.node}
    assert "ConvInteger" in ops
    # DynamicQuantizeLinear rounding can flip one activation quantum: compare loosely
    _check(str(q), rtol=0.05, atol=0.02)


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
    ops = {n.op_type for n in onnx.load(str(q)).graph.node}
    assert {"QLinearConv", "QLinearAdd"} <= ops
    _check(str(q), rtol=0.05, atol=0.02)


def test_conv_integer_per_channel_zero_point_vs_onnx_reference():
    """onnxruntime rejects a per-channel w_zero_point; check against onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    m = M.conv_integer_model(per_channel=True)
    x = _u8((1, 4, 9, 9))
    ref = ReferenceEvaluator(m).run(None, {"x": x})[0]
    got, _ = run_tvm(compile_module(import_onnx(m)), m, {"x": x})
    np.testing.assert_array_equal(got[0], ref)


def test_keep_params_in_input_passthrough():
    mod = import_onnx(M.rnn_model("LSTM"), keep_params_in_input=True)
    assert [p.name for p in mod["main"].params][:3] == ["X", "h0", "c0"]
    assert int(mod["main"].attrs["num_input"]) == 3
