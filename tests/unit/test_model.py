"""forgekit.IRModule: import, introspection, identity, transformations (forgekit/ir.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import forgekit
import forgekit as forge
from conftest import assert_close, make_convnet, make_two_output_model, make_unsupported_model, ort_run
from forgekit.errors import InputError, ModelLoadError, NotAvailableError, UnsupportedOperatorError, UsageError


@pytest.fixture(scope="module")
def ir(convnet_path):
    return forge.from_onnx(convnet_path)


def test_relay_module_alias_and_both_constructors(convnet_path) -> None:
    assert forge.RelayModule is forge.IRModule
    a = forge.RelayModule.from_onnx(str(convnet_path))
    b = forge.from_onnx(onnx.load(convnet_path))
    assert a == b and hash(a) == hash(b)


def test_introspection(ir) -> None:
    assert ir.input_count == 1 and ir.input_names == ["input"]
    assert ir.input_shapes == [("N", 3, 16, 16)] and ir.input_dtypes == ["float32"]
    assert ir.output_count == 1 and ir.output_names == ["probs"]
    assert ir.output_shapes == [("N", 10)] and ir.output_dtypes == ["float32"]
    ops = ir.operators
    assert ops["nn.conv2d"] == 1 and ops["nn.relu"] == 1 and ops["nn.softmax"] == 1
    assert "nn.batch_norm" not in ops  # folded into the convolution by default
    assert ir.graph_count == 1 and ir.subgraph_count == 0
    assert not ir.is_calibrated and not ir.is_quantized and not ir.is_tensorrt and not ir.is_split_tensors
    assert ir.mod["main"] is not None and ir.typed_mod["main"] is not None
    params = ir.params
    assert any(p.shape == (8, 3, 3, 3) for p in params.values())
    assert "input" in repr(ir)


def test_fold_batch_norms_is_real_folding(convnet_path, convnet_input) -> None:
    folded = forge.from_onnx(convnet_path)
    kept = forge.from_onnx(convnet_path, fold_batch_norms=False, fold_constants=False)
    assert "nn.batch_norm" in kept.operators and "nn.batch_norm" not in folded.operators
    expected = ort_run(onnx.load(convnet_path), {"input": convnet_input})[0]
    assert_close(folded.get_inference_function()(convnet_input), expected)
    assert_close(kept.get_inference_function()(convnet_input), expected)


def test_hash_is_structure_fingerprint_is_weights(tmp_path) -> None:
    a = forge.from_onnx(make_convnet(seed=0))
    b = forge.from_onnx(make_convnet(seed=1))
    a2 = forge.from_onnx(make_convnet(seed=0))
    assert hash(a) == hash(b)  # same architecture
    assert a.fingerprint != b.fingerprint  # other weights
    assert a.fingerprint == a2.fingerprint and len(a.fingerprint) == 64  # deterministic
    assert a == a2 and a != b
    # Once folded, conv+bias+BN is the same architecture as conv+bias: same hash, other weights.
    no_bn = forge.from_onnx(make_convnet(seed=0, with_bn=False))
    assert hash(no_bn) == hash(a) and no_bn.fingerprint != a.fingerprint
    assert hash(forge.from_onnx(make_two_output_model())) != hash(a)


def test_fingerprint_is_stable_across_processes(convnet_path) -> None:
    import subprocess
    import sys

    code = f"import forgekit; print(forgekit.from_onnx({str(convnet_path)!r}).fingerprint)"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
            for _ in range(2)}
    assert runs == {forge.from_onnx(convnet_path).fingerprint}


def test_copy_is_deep(convnet_path) -> None:
    a = forge.from_onnx(convnet_path)
    b = a.copy()
    b.set_batch_size(4)
    assert a.input_shapes == [("N", 3, 16, 16)] and b.input_shapes == [(4, 3, 16, 16)]


def test_set_batch_size_symbolic_and_fixed(convnet_path) -> None:
    symbolic = forge.from_onnx(convnet_path).set_batch_size(3)
    assert symbolic.input_shapes == [(3, 3, 16, 16)] and symbolic.output_shapes == [(3, 10)]
    fixed = forge.from_onnx(make_convnet(batch=1))
    assert fixed.input_shapes == [(1, 3, 16, 16)]
    fixed.set_batch_size(5)
    assert fixed.input_shapes == [(5, 3, 16, 16)] and fixed.output_shapes == [(5, 10)]
    x = np.random.default_rng(0).standard_normal((5, 3, 16, 16)).astype(np.float32)
    assert_close(fixed.get_inference_function()(x), ort_run(make_convnet(batch=5), {"input": x})[0])
    with pytest.raises(UsageError):
        fixed.set_batch_size(0)


def test_shape_dict(convnet_path) -> None:
    ir = forge.from_onnx(convnet_path, {"input": [7, 3, 16, 16]})
    assert ir.input_shapes == [(7, 3, 16, 16)]
    with pytest.raises(UsageError, match="model's inputs are: input"):
        forge.from_onnx(convnet_path, {"image": [1, 3, 16, 16]})


def test_inference_function_matches_onnxruntime(ir, convnet_input, convnet_path) -> None:
    f = ir.get_inference_function()
    out = f(convnet_input)
    assert isinstance(out, np.ndarray)
    assert_close(out, ort_run(onnx.load(convnet_path), {"input": convnet_input})[0])
    with pytest.raises(InputError, match="dtype"):
        f(convnet_input.astype(np.float64))
    with pytest.raises(InputError, match="takes 1 input"):
        f(convnet_input, convnet_input)


def test_inference_function_multiple_outputs() -> None:
    model = make_two_output_model()
    ir = forge.from_onnx(model)
    assert ir.input_names == ["a", "b"] and ir.output_names == ["sum", "prod"]
    a, b = (np.arange(8, dtype=np.float32).reshape(2, 4) + i for i in range(2))
    total, prod = ir.get_inference_function()(a, b)
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(prod, a * b)


def test_unsupported_ops_are_all_listed_at_once() -> None:
    with pytest.raises(UnsupportedOperatorError) as info:
        forge.from_onnx(make_unsupported_model())
    message = str(info.value)
    assert "DeformConv (deform_a, deform_b)" in message and "com.microsoft.FusedConv (fused)" in message
    assert "2 unsupported operator type(s)" in message and "Relu" not in message and "\n" not in message


def test_load_errors(tmp_path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        forge.from_onnx(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00this is not protobuf\xff" * 10)
    with pytest.raises(ModelLoadError, match="not a valid ONNX model"):
        forge.from_onnx(bad)
    with pytest.raises(ModelLoadError, match="directory"):
        forge.from_onnx(tmp_path)


def test_quantization_entry_points_delegate_to_forgekit_quantize(ir) -> None:
    # the behaviour itself is tested in tests/test_quantize.py
    clone = ir.copy()
    with pytest.raises(UsageError, match="Calibration data is empty"):
        clone.calibrate([])
    with pytest.raises(UsageError, match="needs calibration data"):
        clone.quantize(quant_type="static")
    clone.split_tensors()
    assert clone.is_split_tensors and not ir.is_split_tensors


def test_forgekit_import_is_lazy() -> None:
    import subprocess
    import sys

    code = "import sys, forgekit, forgekit.runtime; print('tvm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert "from_onnx" in dir(forgekit)
