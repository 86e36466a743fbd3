"""forgekit/evaluate/compare.py: elementwise tolerances for fp32 artifacts, the cosine criterion for
artifacts that compute in less (bf16/fp16, forgekit-quantized)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from forgekit.evaluate.compare import compare, compare_outputs, cosine, min_cosine_for


def _bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (nearest even) and back: what a bf16 kernel's inputs lose."""
    bits = x.astype(np.float32).view(np.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("meta, expected", [
    ({"precision": "float32"}, None), ({"precision": "bfloat16"}, 0.999), ({"precision": "float16"}, 0.999),
    ({"precision": "float32", "quantization": {"activation_dtype": "int8"}}, 0.99), ({}, None)])
def test_criterion_follows_the_artifacts_arithmetic(meta, expected) -> None:
    assert min_cosine_for(meta) == expected


def test_bf16_rounding_fails_fp32_tolerances_and_passes_the_cosine() -> None:
    ref = np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)
    got = _bf16(ref)
    assert not compare("y", got, ref).ok  # 2**-9 relative error is past rtol 1e-3
    judged = compare("y", got, ref, min_cosine=0.999)
    assert judged.ok and judged.cosine > 0.99999 and "cosine" in judged.line()
    summary = compare_outputs([got], [ref], 1e-3, 1e-4, 0.999)
    assert summary["outputs_match"] and summary["min_cosine"] > 0.99999


def test_the_cosine_still_catches_wrong_outputs() -> None:
    ref = np.random.default_rng(1).standard_normal(256).astype(np.float32)
    wrong = compare("y", np.roll(ref, 1), ref, min_cosine=0.99)
    assert not wrong.ok and "cosine" in wrong.note and "MISMATCH" in wrong.line()
    assert not compare("y", ref[:128], ref, min_cosine=0.99).ok  # a wrong shape is wrong under any criterion
    ints = np.arange(6)
    assert not compare("i", ints + 1, ints, min_cosine=0.99).ok  # integers stay exact
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0


def test_an_ill_conditioned_output_matches_within_the_references_own_noise() -> None:
    """A saturated sigmoid map (max 2e-5, PP-OCRv4 det on random pixels): a 1.4e-7 reassociation difference
    fails the scale-relative tolerance, passes next to onnxruntime's own 1.5e-7 noise, and a real error
    (10x that) still fails."""
    ref = np.full((1, 1, 64, 64), 2e-5, np.float32)
    ref[0, 0, 0, 0] = 2.1e-5
    close = ref + np.float32(1.4e-7)
    assert not compare("map", close, ref).ok
    judged = compare("map", close, ref, noise=1.5e-7)
    assert judged.ok and "onnxruntime's own noise 1.5e-07" in judged.line()
    assert not compare("map", ref + np.float32(1.5e-6), ref, noise=1.5e-7).ok
    both = compare_outputs([close], [ref], 1e-3, 1e-4, noise=[1.5e-7])
    assert both["outputs_match"] and both["noise_floor"] == 1.5e-7



def test_a_cosine_deficit_within_the_references_own_passes() -> None:
    """Judged by cosine: an output whose two fp32 evaluations already disagree (cosine 0.9975, PP-OCRv4 det on
    random pixels) passes at a deficit within 4x that; a wrong output (a shifted map) still fails, and without
    a measured deficit the 0.999 bar stands."""
    rng = np.random.default_rng(2)
    ref = np.abs(rng.standard_normal(4096))
    noisy = ref + 0.09 * rng.standard_normal(4096)  # cosine about 0.997
    cos = cosine(noisy, ref)
    assert 0.99 < cos < 0.999
    assert not compare("map", noisy, ref, min_cosine=0.999).ok
    judged = compare("map", noisy, ref, min_cosine=0.999, cosine_noise=0.0025)
    assert judged.ok and "onnxruntime's own fp32 cosine 0.997500: ill-conditioned" in judged.line()
    assert not compare("map", noisy, ref, min_cosine=0.999, cosine_noise=(1 - cos) / 5).ok
    wrong = compare("map", np.roll(ref, 7), ref, min_cosine=0.999, cosine_noise=0.0025)
    assert not wrong.ok and "MISMATCH" in wrong.line()
    # a deficit that prints as 1.000000 is no ill-conditioning to report (a wrong int8 model said it was)
    assert "ill-conditioned" not in compare("map", np.roll(ref, 7), ref, min_cosine=0.999, cosine_noise=1e-9).line()
    both = compare_outputs([noisy], [ref], 1e-3, 1e-4, 0.999, cosine_noise=[0.0025])
    assert both["outputs_match"] and both["reference_cosine"] == pytest.approx(0.9975)


def test_the_cosine_noise_is_onnxruntimes_cosine_with_itself(tmp_path) -> None:
    """Conv + BatchNorm + Sigmoid: the BatchNorm folding onnxruntime does when optimizing moves the output by a
    cosine deficit above 0 (tiny: a well-conditioned output); a lone Relu moves it by none (exactly 0)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from forgekit.evaluate import reference

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "w"),
             *(numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype(np.float32), n) for n in ("s", "v")),
             *(numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), n) for n in ("b", "m"))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["z"]),
             helper.make_node("Sigmoid", ["z"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])
    graph = helper.make_graph(nodes, "cbns", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "cbns.onnx")
    fed = {"x": rng.standard_normal((1, 8, 32, 32)).astype(np.float32)}
    expected = reference.run(reference.session(tmp_path / "cbns.onnx"), fed)
    deficit = reference.cosine_noise(tmp_path / "cbns.onnx", fed, expected)[0]
    assert 0 < deficit < 1e-9, deficit
    relu = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(relu, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "relu.onnx")
    expected = reference.run(reference.session(tmp_path / "relu.onnx"), fed)
    assert reference.cosine_noise(tmp_path / "relu.onnx", fed, expected) == [0.0]


def test_the_noise_floor_is_onnxruntimes_disagreement_with_itself(tmp_path) -> None:
    """Conv + BatchNorm: onnxruntime folds the BatchNorm into the weights when optimizing, so the two graphs
    round differently (a floor above 0 but tiny); a lone Relu has nothing to fuse (floor 0)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from forgekit.evaluate import reference

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "w"),
             *(numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype(np.float32), n) for n in ("s", "v")),
             *(numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), n) for n in ("b", "m"))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])
    graph = helper.make_graph(nodes, "cbn", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "cbn.onnx")
    fed = {"x": rng.standard_normal((1, 8, 32, 32)).astype(np.float32)}
    expected = reference.run(reference.session(tmp_path / "cbn.onnx"), fed)
    floor = reference.noise_floor(tmp_path / "cbn.onnx", fed, expected)[0]
    assert 0 < floor < 1e-4 * np.abs(expected[0]).max(), floor
    relu = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(relu, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "relu.onnx")
    expected = reference.run(reference.session(tmp_path / "relu.onnx"), fed)
    assert reference.noise_floor(tmp_path / "relu.onnx", fed, expected) == [0.0]


def _masked_scores() -> np.ndarray:
    """Attention-style scores in [-3, 3) with a quarter of them masked by -FLT_MAX."""
    rng = np.random.default_rng(3)
    ref = rng.uniform(-3, 3, (8, 64)).astype(np.float32)
    ref[:, 48:] = np.finfo(np.float32).min
    return ref


@pytest.mark.parametrize("fill", [np.finfo(np.float32).min, -np.inf, -1e9])
def test_masked_elements_are_judged_apart_from_the_numbers(fill) -> None:
    """One -FLT_MAX made the tolerance 1e-4 * 3.4e38: an output off by 1.0 everywhere passed.  The masks now
    must be masks in the output too, and the tolerance comes from the other elements; -inf and -1e9 masks
    (scores + -1e9) alike."""
    ref = _masked_scores()
    ref[:, 48:] = fill + ref[:, 48:] * (fill == -1e9)
    right = ref + np.float32(1e-5)
    judged = compare("scores", right, ref)
    assert judged.ok and judged.masked == 8 * 16 and "masked" in judged.line()
    assert judged.tolerance < 1e-3  # 1e-4 of the numbers' scale (3), not of the mask's
    wrong = ref.copy()
    wrong[:, :48] += 1.0
    assert not compare("scores", wrong, ref).ok
    unmasked = ref.copy()
    unmasked[0, 50] = 0.5  # an element the model should have masked
    judged = compare("scores", unmasked, ref)
    assert not judged.ok and "1 of 128 masked element(s) not masked alike" in judged.line()
    spurious = right.copy()
    spurious[0, 0] = fill  # a mask where the reference has a number
    assert not compare("scores", spurious, ref).ok
    assert not compare("scores", wrong, ref, min_cosine=0.99).ok  # the cosine is of the numbers too
    assert compare("scores", right, ref, min_cosine=0.99).ok


def test_a_wide_but_gapless_range_has_no_masks() -> None:
    """Large values that continue the output's range (logits up to 1e7 among values down to 1e3) are numbers."""
    ref = np.geomspace(1e3, 1e7, 200).astype(np.float32)
    judged = compare("y", ref * np.float32(1.0005), ref)
    assert judged.masked == 0 and judged.ok
    assert not compare("y", ref * 1.01, ref).ok


def _masked_model(shift: float) -> onnx.ModelProto:
    """scores = x @ W (+ shift), -FLT_MAX where mask is false: a masked attention row."""
    w = np.random.default_rng(4).standard_normal((8, 8)).astype(np.float32) + np.float32(shift)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"]),
             helper.make_node("Where", ["mask", "s", "fill"], ["y"])]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
                                                helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(w, "w"),
                               numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "fill")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_verify_fails_a_wrong_model_behind_flt_max_masks(tmp_path) -> None:
    """Against a model with other weights (same masks), verify said 'outputs match' (atol 3.4e34); now exit 13,
    and the artifact's own model still verifies."""
    import forgekit as forge
    from conftest import run_cli

    onnx.save(_masked_model(0.0), tmp_path / "m.onnx")
    onnx.save(_masked_model(0.5), tmp_path / "wrong.onnx")
    forge.from_onnx(tmp_path / "m.onnx").compile(target="host", output_path=tmp_path / "a", opt_level=1)
    proc = run_cli("verify", str(tmp_path / "a"), "--onnx", str(tmp_path / "m.onnx"))
    assert proc.returncode == 0 and "masked element(s) judged apart" in proc.stdout, proc.stdout + proc.stderr
    proc = run_cli("verify", str(tmp_path / "a"), "--onnx", str(tmp_path / "wrong.onnx"))
    assert proc.returncode == 13, proc.stdout + proc.stderr


def test_the_references_own_noise_leaves_the_masks_out(tmp_path) -> None:
    """-inf masks made the noise floor nan (-inf - -inf) and -FLT_MAX ones made the cosine deficit that of the
    masks: both are measured on the numbers now."""
    from forgekit.evaluate.reference import cosine_noise, noise_floor, run, session

    model = _masked_model(0.0)
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array(-np.inf, np.float32), "fill"))
    onnx.save(model, tmp_path / "m.onnx")
    fed = {"x": np.random.default_rng(0).random((1, 8), np.float32), "mask": np.array([[1, 0] * 4], bool)}
    expected = run(session(tmp_path / "m.onnx"), fed)
    assert np.isinf(expected[0]).sum() == 4
    floor, deficit = noise_floor(tmp_path / "m.onnx", fed, expected), cosine_noise(tmp_path / "m.onnx", fed, expected)
    assert np.isfinite(floor[0]) and 0.0 <= floor[0] < 1e-5 and 0.0 <= deficit[0] < 1e-6
