"""The accuracy budget measures what each layer costs the outputs (forgekit/quantize/sensitivity.py,
agreement.py, rewrite.gated_rewrite).

The model is a detector head in miniature: ``concat([box, sigmoid(class logits)])``, box channels ~100x the
class scores.  Two classes of input the budget used to get wrong:

* an output whose channels differ in scale: the whole-tensor cosine (0.9994) hid class channels at 0.97
  (channel mean), so ``max_accuracy_drop=0.01`` kept nothing in fp32 (NudeNet 320n: whole 0.9996, class
  scores 0.93-0.97);
* a layer whose input quantizes worst but barely reaches the outputs (a heavy-tailed input into a branch
  1e-4 of the box) against one whose input quantizes better but feeds the class logits: the old order (input
  noise) kept the first one first.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import forgekit
from forgekit.quantize import graph, plan
from forgekit.quantize.agreement import agreement, channel_cosine, output_entries
from forgekit.quantize.report import local_snr

OPTS = {"per_channel": True, "calib_method": "minmax", "smoothing": None, "quant_type": "static"}


def head_model():
    rng = np.random.default_rng(0)

    def weight(name, *shape, k=1.0):
        w = rng.standard_normal(shape) * k / np.sqrt(np.prod(shape[1:]))
        return numpy_helper.from_array(w.astype(np.float32), name)

    spike = np.zeros((1, 16, 16, 16), np.float32)
    spike[0, :, 3, 5] = 150.0  # one hot pixel: the class conv's input range is 50x its bulk
    inits = [weight("wa", 16, 8, 3, 3), weight("wb", 8, 16, 1, 1, k=100.0), weight("wc", 8, 16, 1, 1, k=2.0),
             weight("wd", 8, 8, 1, 1, k=0.01), numpy_helper.from_array(spike, "spike"),
             numpy_helper.from_array(np.full(8, -3.0, np.float32), "cb")]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]), helper.make_node("Add", ["ar", "spike"], ["f"]),
             helper.make_node("Conv", ["f", "wb"], ["b"]),            # box: ~100
             helper.make_node("Conv", ["z", "wd"], ["d"]),            # a heavy-tailed input, 1e-4 of the box
             helper.make_node("Add", ["b", "d"], ["box"]),
             helper.make_node("Conv", ["f", "wc", "cb"], ["c"]),      # class logits around -3
             helper.make_node("Sigmoid", ["c"], ["cls"]),
             helper.make_node("Concat", ["box", "cls"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8, 16, 16])
                                          for n in "xz"],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32),
             "z": rng.standard_t(1.2, (1, 8, 16, 16)).astype(np.float32)} for _ in range(n)]


def class_cosine(got: np.ndarray, ref: np.ndarray) -> float:
    a, b = got[:, 8:].ravel().astype(np.float64), ref[:, 8:].ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_channel_cosine_sees_every_channel() -> None:
    ref = np.concatenate([np.full((1, 2, 5), 100.0), np.full((1, 2, 5), 0.01)], axis=1)
    got = ref.copy()
    got[:, 2:] *= np.array([1, -1, 1, -1, 1])  # the small channels half wrong
    whole = float(got.ravel() @ ref.ravel() / np.linalg.norm(got) / np.linalg.norm(ref))
    assert whole > 0.9999 and abs(channel_cosine(got, ref) - 0.6) < 1e-9  # (1 + 1 + 0.2 + 0.2) / 4
    assert channel_cosine(np.ones((2, 3)), np.ones((2, 3))) is None  # [N, D]: no channels
    assert channel_cosine(np.zeros((1, 2, 3)), np.zeros((1, 2, 3))) == 1.0


def _served(bad: list[float], n: int) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """``n`` samples of a [1, 6, 50] detector-like output, served exactly except those of ``bad``, whose second
    half of each channel is off by that much (0.1: cosine 0.996, 0.3: 0.974)."""
    rng = np.random.default_rng(3)
    ref = [[rng.uniform(0.0, 1.0, (1, 6, 50)).astype(np.float32)] for _ in range(n)]
    got = [[r[0].copy()] for r in ref]
    for i, error in enumerate(bad):
        got[i][0][..., 25:] += error
    return ref, got


def test_one_badly_served_sample_is_not_hidden_by_the_others() -> None:
    # the mean over the samples judged: NudeNet 320n int8, 6 calibration photos, max_accuracy_drop=0.01 kept
    # one conv in fp32 and left the worst photo's class scores at cosine 0.879 (0.975 judged by the worst)
    ref, got = _served([0.3], 6)
    entry = output_entries(ref, got)[0]
    assert entry["cosine"] > 0.99 > entry["worst_cosine"]  # the mean passes a 0.01 budget, the worst does not
    assert agreement([entry]) == min(entry["worst_cosine"], entry["worst_channel_cosine"]) < 0.99


def test_among_many_samples_the_very_worst_few_do_not_decide() -> None:
    ref, got = _served([3.0] * 2 + [0.1] * 3, 41)  # 41 samples: the worst 2 (5 %) are set aside, then 0.1's
    entry = output_entries(ref, got)[0]
    assert entry["worst_cosine"] > 0.99 and entry["worst_cosine"] < 1.0
    ref, got = _served([3.0] * 3, 41)  # a third one counts
    assert output_entries(ref, got)[0]["worst_cosine"] < 0.9


def test_gated_model_is_the_float_and_the_int8_model() -> None:
    """One build, both models: gates 0 compute the float model, gates 1 the quantized one."""
    from forgekit.quantize.sensitivity import Mixer

    ir = forgekit.from_onnx(head_model())
    ir.calibrate(feeds(4, 1))
    plans, _ = plan(ir.mod, ir.calibration, **OPTS)
    samples = [[f["x"], f["z"]] for f in feeds(2, 5)]
    mixer = Mixer(ir.mod, plans, samples)
    floats = ir.get_inference_function("host")
    for s, ref in zip(samples, mixer.reference):
        np.testing.assert_allclose(ref[0], floats(*s), rtol=1e-5, atol=1e-4)
    ir.quantize(**OPTS)
    quantized = ir.get_inference_function("host")
    for s, got in zip(samples, mixer.outputs(plans)):
        np.testing.assert_allclose(got[0], quantized(*s), rtol=1e-5, atol=1e-4)


def test_budget_keeps_the_layer_that_costs_the_outputs_most() -> None:
    model = head_model()
    ir = forgekit.from_onnx(model)
    names = [op.name for op in graph.describe(ir.mod["main"])]  # A, box conv, heavy-tailed conv, class conv
    ir.calibrate(feeds(4, 1))
    plans, _ = plan(ir.mod, ir.calibration, **OPTS)
    snr = {i: local_snr(ir.calibration, plans, i) for i in plans}
    assert min(snr, key=snr.get) == 2  # the input that quantizes worst is the branch that does not matter

    ir.quantize(**OPTS, max_accuracy_drop=0.01)
    rep = ir.quantization_report
    assert rep["budget_met"] and rep["accuracy_drop"] <= 0.01
    assert rep["fp32_layers"] == [names[3]]  # the class conv alone
    assert max(rep["layers"], key=lambda layer: layer["solo_drop"])["name"] == names[3]

    plain = forgekit.from_onnx(model)
    plain.calibrate(feeds(4, 1))
    plain.quantize(**OPTS)
    out = plain.accuracy_report()["outputs"][0]
    assert out["cosine"] > 0.998 and out["channel_cosine"] < 0.99  # what the whole cosine hid (0.9994, 0.973)

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    budget, everything = ir.get_inference_function("host"), plain.get_inference_function("host")
    for f in feeds(3, 9):  # held out
        ref = sess.run(None, f)[0]
        assert class_cosine(budget(f["x"], f["z"]), ref) > 0.99 > class_cosine(everything(f["x"], f["z"]), ref)
