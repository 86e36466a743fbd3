"""Accuracy of a quantized model against its float original, per layer and at the outputs.

Per quantizable op: cosine similarity and SNR (dB) between the fp32 and the quantized op output on the
same inputs (errors of earlier layers included, as at deployment).  Outputs: top-1 agreement for
classifier-shaped outputs (``[N, classes]``), otherwise the lower of the mean cosine and the mean
cosine per channel (:mod:`.agreement`; also for L2-normalized ``[N, D]`` embeddings).  The *accuracy drop*
is ``1 - agreement`` of the worst output.

:func:`quantize_within_budget` keeps layers in fp32, the one that costs the outputs most alone first (see
:mod:`.sensitivity`; 1, 2, 4, ... layers, then bisection), until the drop on the calibration samples is
within ``max_accuracy_drop``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import UsageError
from . import graph
from .agreement import agreement, cosine, output_entries

if TYPE_CHECKING:
    import tvm

    from .calibrate import Calibration



def _named(func: Any, count: int) -> list[Any]:
    by_name = {b.var.name: b.var for b in graph.bindings(func)}
    return [by_name[f"fkq_{i}"] for i in range(count)]


def _layer_tensors(mod: Any, quantized: bool, count: int, samples: Sequence[list[np.ndarray]]) -> list[Any]:
    from .calibrate import build_runner, flatten_outputs

    def pick(flat: Any) -> list[Any]:
        return _named(flat, count) if quantized else [b.var for b, _ in graph.quantizable(flat)]

    exposed, _ = graph.expose(mod, pick)
    run, _device = build_runner(exposed, use_cuda=False)
    results = []
    for inputs in samples:
        res = run(inputs)
        results.append((flatten_outputs(res[0]), flatten_outputs(res[1])))
    return results


def _snr(a: np.ndarray, b: np.ndarray) -> float:
    sig, err = float(np.sum(a.astype(np.float64) ** 2)), float(np.sum((a.astype(np.float64) - b) ** 2))
    return float("inf") if err == 0 else 10 * np.log10(max(sig, 1e-30) / err)


def compare(float_mod: Any, quant_mod: Any, samples: Sequence[list[np.ndarray]],
            kept: Sequence[int] = ()) -> dict[str, Any]:
    """The accuracy report of ``quant_mod`` against ``float_mod`` on ``samples``."""
    if not samples:
        raise UsageError("No samples to compare on: calibrate first (the report uses calibration samples).")
    ops = graph.describe(float_mod["main"])
    ref = _layer_tensors(float_mod, False, len(ops), samples)
    got = _layer_tensors(quant_mod, True, len(ops), samples)
    layers = []
    for op in ops:
        a = np.concatenate([r[1][op.index].ravel() for r in ref])
        b = np.concatenate([g[1][op.index].ravel() for g in got])
        layers.append({"name": op.name, "op": op.op, "weight_shape": list(op.weight_shape),
                       "precision": "float32" if op.index in kept else "int8",
                       "cosine": round(cosine(a, b), 6), "snr_db": round(_snr(a, b), 2)})
    outputs = output_entries([r[0] for r in ref], [g[0] for g in got])
    agree = agreement(outputs)
    return {"samples": len(samples), "metric": "top1_agreement" if "top1_agreement" in outputs[0] else "cosine",
            "agreement": agree, "accuracy_drop": round(1.0 - agree, 6), "outputs": outputs,
            "layers": layers, "fp32_layers": [layers[i]["name"] for i in kept]}


def accuracy_report(float_mod: tvm.IRModule, quant_mod: tvm.IRModule, quantization: dict[str, Any],
                    calib: Calibration | None, samples: Sequence[list[np.ndarray]] | None = None) -> dict[str, Any]:
    """Report for ``quant_mod`` (quantized with the parameters ``quantization``) against ``float_mod``, on
    ``samples`` (default: the calibration samples kept in ``calib``)."""
    samples = samples if samples is not None else (calib.extra.get("samples", []) if calib is not None else [])
    kept = [i for i, op in enumerate(graph.describe(float_mod["main"]))
            if op.name in (quantization or {}).get("fp32_ops", [])]
    return compare(float_mod, quant_mod, samples, kept)


def local_snr(calib: Calibration | None, plans: dict[int, Any], index: int) -> float:
    """SNR (dB) of quantizing op ``index``'s input alone, estimated from its calibration histogram:
    rounding noise ``scale^2 / 12`` inside the range plus the clipped excess outside it.  Unlike the
    per-layer SNR of the report it excludes the error inherited from earlier layers, so it ranks which
    layers to keep in fp32."""
    from .stats import BINS

    plan = plans.get(index)
    if calib is None or plan is None or plan.x_scale is None:
        return float("inf")
    stats = calib.stats[index]
    centers = (np.arange(BINS) + 0.5) * (stats.hist_range / BINS)
    power = float(np.sum(stats.hist * centers ** 2))
    scale = plan.x_scale if plan.smooth is None else plan.x_scale * float(np.mean(plan.smooth))
    # the histogram is of |x|; an asymmetric uint8 range belongs to a mostly non-negative tensor, so its
    # positive limit, (255 - zero_point) levels above zero, decides what is clipped
    limit = plan.x_scale * (255 - plan.zero_point if plan.x_dtype == "uint8" else 127)
    if plan.smooth is not None:
        limit = float("inf")  # smoothed ranges are the calibrated maxima: nothing is clipped
    inside = centers <= limit
    noise = float(np.sum(stats.hist[inside]) * scale ** 2 / 12 + np.sum(stats.hist[~inside] * (centers[~inside] - limit) ** 2))
    return 10 * np.log10(max(power, 1e-30) / max(noise, 1e-30))


def quantize_within_budget(float_mod: tvm.IRModule, calib: Calibration | None, budget: float,
                           options: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Quantize, keeping in fp32 the layers that cost the outputs most (each measured alone, see
    :mod:`.sensitivity`) until the accuracy drop on the calibration samples is at most ``budget``."""
    from . import plan as quantize_plan, policy_fp32, quantize
    from .sensitivity import Mixer

    if not 0 <= budget <= 1:
        raise UsageError(f"max_accuracy_drop must be a fraction between 0 and 1 (e.g. 0.01), got {budget}.")
    samples = calib.extra.get("samples", []) if calib is not None else []
    if not samples:
        raise UsageError("max_accuracy_drop needs calibration samples to measure the drop: call ir.calibrate() first.")
    func = float_mod["main"]
    policy = policy_fp32(func, bool(options.get("quantize_depthwise")))
    plans, _ = quantize_plan(float_mod, calib, keep_fp32=policy,
                             **{k: v for k, v in options.items() if k not in ("kernel_dtype", "bias_dtype",
                                                                               "quantize_depthwise")})
    mixer = Mixer(float_mod, plans, samples)
    planned = set(plans)
    order: list[int] = []
    solo: dict[int, float] = {}

    def trial(count: int) -> float:
        return mixer.drop(planned - set(order[:count]))

    count = 0
    if trial(0) > budget:
        solo = mixer.solo_drops()
        # the costliest alone first; the input's own quantization noise breaks ties (layers that cost nothing
        # measurable alone can still add up)
        order = sorted(planned, key=lambda i: (-solo[i], local_snr(calib, plans, i)))
        # doubling finds a count that meets the budget, then bisection the smallest one: each layer kept in
        # fp32 costs speed, and doubling alone overshoots by up to 2x (measured on PP-OCRv4 rec: 31 layers
        # kept for a budget that 25 meet)
        lo, hi = 0, 1
        while hi < len(order) and trial(hi) > budget:
            lo, hi = hi, hi * 2
        hi = min(hi, len(order))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if trial(mid) <= budget else (mid, hi)
        count = hi
    mod, info = quantize(float_mod, calib, **options, keep_fp32=set(order[:count]))
    names = [op.name for op in graph.describe(func)]
    rep = compare(float_mod, mod, samples, [k for k, n in enumerate(names) if n in info["fp32_ops"]])
    for i, value in solo.items():
        rep["layers"][i]["solo_drop"] = value
    rep["max_accuracy_drop"] = budget
    rep["budget_met"] = rep["accuracy_drop"] <= budget
    info["max_accuracy_drop"] = budget
    return mod, info, rep
