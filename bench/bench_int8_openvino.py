"""forgekit int8 vs OpenVINO int8 (NNCF post-training quantization), same calibration samples, one process.

    .venv/bin/python bench/bench_int8_openvino.py bench/models/yolo_style.onnx [--calib 16] [--calib-data DIR]
        [--threads 2] [--runs 40] [--profile] [--preset performance|mixed] [--out /tmp/int8h]

(a) forgekit: ``from_onnx`` -> ``calibrate(samples)`` -> ``quantize(per_channel=True)`` -> ``compile`` (with
    ``--export-metadata``'s compile report, so ``forgekit bench ART --onnx M --profile`` can name kernels);
(b) NNCF: ``nncf.quantize(core.read_model(M), nncf.Dataset(samples), preset=...)`` on the same samples;
(c) forgekit int8, onnxruntime fp32, OpenVINO f32 and OpenVINO int8 timed in alternating blocks in this
    process, ``threads`` each (``TVM_NUM_THREADS``, ``intra_op_num_threads``, ``INFERENCE_NUM_THREADS`` with
    ``PERFORMANCE_HINT=LATENCY``);
(d) cosine of every int8 output against onnxruntime fp32 on held-out inputs, the worst sample's (and of the
    class-score rows 4: of a YOLO ``[1, 4 + C, A]`` output: ``--yolo``, or C = 80), with the detections both
    make (score >= 0.25, NMS at IoU 0.45, as NudeNet and Ultralytics decode): how many fp32 makes, how many
    of those int8 finds again (same class, IoU >= 0.5), its extra ones, and the largest score change of the
    ones found; and the latency ratios.

nncf and openvino are benchmark-only dependencies (``pip install nncf openvino``); forgekit never imports them.
Samples are seeded uniform [0, 1) images (what a detector's preprocessing produces) unless ``--calib-data``
(and ``--held-data``) name folders of .npy files: ``bench/photos.py`` writes real photos so.  NudeNet 320n on
them: ``--shape 1,3,320,320 --yolo --calib-data P/calib --held-data P/held``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def _samples(args: argparse.Namespace, shape: list[int], n: int, seed: int) -> list[np.ndarray]:
    folder = args.calib_data if seed == 0 else args.held_data
    if folder:
        files = sorted(Path(folder).glob("*.npy"))[:n if seed == 0 else None]
        return [np.load(f).astype(np.float32).reshape(shape) for f in files]
    rng = np.random.default_rng(seed)
    return [rng.random(shape, dtype=np.float32) for _ in range(n)]


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two (cx, cy, w, h) boxes."""
    w = max(0.0, min(a[0] + a[2] / 2, b[0] + b[2] / 2) - max(a[0] - a[2] / 2, b[0] - b[2] / 2))
    h = max(0.0, min(a[1] + a[3] / 2, b[1] + b[3] / 2) - max(a[1] - a[3] / 2, b[1] - b[3] / 2))
    return float(w * h / (a[2] * a[3] + b[2] * b[3] - w * h + 1e-9))


def detections(out: np.ndarray, score: float = 0.25, iou: float = 0.45) -> list[tuple[int, float, np.ndarray]]:
    """(class, score, box) of a YOLO ``[1, 4 + C, A]`` output: anchors scoring ``score`` or more, greedy NMS."""
    rows = out[0].T
    best, cls = rows[:, 4:].max(axis=1), rows[:, 4:].argmax(axis=1)
    kept: list[int] = []
    for i in np.argsort(-best):
        if best[i] < score:
            break
        if all(_iou(rows[i, :4], rows[j, :4]) <= iou for j in kept):
            kept.append(int(i))
    return [(int(cls[i]), float(best[i]), rows[i, :4]) for i in kept]


def _agreement(got: np.ndarray, ref: np.ndarray) -> tuple[int, int, int, float]:
    """(fp32 detections, found again: same class and IoU >= 0.5, extra ones, largest score change of those found)."""
    want, have = detections(ref), detections(got)
    used: set[int] = set()
    change = 0.0
    for c, sc, box in want:
        match = max(((_iou(box, b), j) for j, (gc, _, b) in enumerate(have) if gc == c and j not in used),
                    default=(0.0, -1))
        if match[0] >= 0.5:
            used.add(match[1])
            change = max(change, abs(sc - have[match[1]][1]))
    return len(want), len(used), len(have) - len(used), change


def _compare(name: str, outs: list[np.ndarray], ref: list[np.ndarray], yolo: bool = False) -> dict[str, float]:
    res = {}
    for i, (a, b) in enumerate(zip(outs, ref)):
        res[f"{name}_out{i}_cos"] = _cos(a, b)
        if b.ndim == 3 and (b.shape[1] == 84 or yolo and i == 0):  # YOLO: rows 4.. are the sigmoid class scores
            res[f"{name}_out{i}_cls_cos"] = _cos(a[:, 4:], b[:, 4:])
            # random-weight scores sit near 0.5, where any cosine is ~1: compare the logits as well
            logit = lambda p: np.log(np.clip(p, 1e-6, 1 - 1e-6) / np.clip(1 - p, 1e-6, 1))  # noqa: E731
            res[f"{name}_out{i}_cls_logit_cos"] = _cos(logit(a[:, 4:]), logit(b[:, 4:]))
            res[f"{name}_out{i}_box_cos"] = _cos(a[:, :4], b[:, :4])
            res[f"{name}_out{i}_box_maxabs_px"] = float(np.abs(a[:, :4] - b[:, :4]).max())
            res[f"{name}_out{i}_cls_maxabs"] = float(np.abs(a[:, 4:] - b[:, 4:]).max())
            found = dict(zip(("dets", "found", "extra", "score_change"), _agreement(a, b)))
            res.update({f"{name}_out{i}_{k}": v for k, v in found.items()})
    return res


#: accuracy keys that count detections (summed over the samples, printed as integers)
COUNTS = ("_dets", "_found", "_extra")


def _summary(key: str, values: list[float]) -> float:
    """Over the held-out samples: the worst cosine, the total of detection counts, the largest error."""
    if key.endswith(COUNTS):
        return float(sum(values))
    return min(values) if "cos" in key else max(values)


def run(args: argparse.Namespace) -> dict:
    import onnxruntime as ort
    import openvino as ov

    import forgekit as forge
    from forgekit.runtime import Engine
    from forgekit.runtime.stats import latency_stats

    model = str(Path(args.model).absolute())
    stem = Path(model).stem
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.shape:  # a model whose height and width are dynamic (NudeNet, any Ultralytics export)
        import onnx

        graph = onnx.load(model, load_external_data=False).graph
        first = next(i.name for i in graph.input if i.name not in {t.name for t in graph.initializer})
        ir = forge.from_onnx(model, {first: [int(d) for d in args.shape.split(",")]})
    else:
        ir = forge.from_onnx(model)
    name = ir.input_names[0]
    shape = [d if isinstance(d, int) else 1 for d in ir.input_shapes[0]]
    calib = _samples(args, shape, args.calib, 0)
    held = _samples(args, shape, 4, 1)

    # (a) forgekit int8
    t0 = time.perf_counter()
    ir.calibrate(calib)
    ir.quantize(args.activation_dtype, per_channel=True, calib_method=args.calib_method, quant_type="static",
                max_accuracy_drop=args.max_accuracy_drop)
    from forgekit.targets import parse_target

    art = ir.compile(target={**parse_target(args.target).target, "num-cores": args.threads},
                     output_path=out / f"{stem}.int8", force_overwrite=True, export_metadata=True)
    fk_s = time.perf_counter() - t0
    # (b) NNCF
    import nncf

    core = ov.Core()
    t0 = time.perf_counter()
    preset = nncf.QuantizationPreset.PERFORMANCE if args.preset == "performance" else nncf.QuantizationPreset.MIXED
    ov_int8 = nncf.quantize(core.read_model(model), nncf.Dataset(calib), preset=preset, subset_size=len(calib))
    nncf_s = time.perf_counter() - t0
    ov.save_model(ov_int8, str(out / f"{stem}.nncf_int8.xml"))
    cfg = {"INFERENCE_NUM_THREADS": args.threads, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    ov32 = core.compile_model(model, "CPU", cfg).create_infer_request()
    ov8 = core.compile_model(ov_int8, "CPU", cfg).create_infer_request()
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    engine = Engine(art.path)

    # (d) accuracy on held-out inputs
    acc: dict[str, list[float]] = {}
    for x in held:
        ref = sess.run(None, {name: x})
        fk = [np.asarray(o) for o in engine.infer(x)]
        r8 = ov8.infer({0: x})
        ovo = [np.array(r8[o]) for o in ov8.model_outputs]
        for k, v in {**_compare("forgekit_int8", fk, ref, args.yolo),
                     **_compare("openvino_int8", ovo, ref, args.yolo)}.items():
            acc.setdefault(k, []).append(v)
    accuracy = {k: _summary(k, v) for k, v in acc.items()}

    # (c) timing: alternating blocks
    x = held[0]
    feeds = {0: x}
    fns = {"forgekit-int8": engine.prepared_call(x), "onnxruntime-fp32": lambda: sess.run(None, {name: x}),
           "openvino-f32": lambda: ov32.infer(feeds), "openvino-int8": lambda: ov8.infer(feeds)}
    for fn in fns.values():
        for _ in range(5):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    while any(len(v) < args.runs for v in samples.values()):
        for key, fn in fns.items():
            time.sleep(0.05)  # lets the other runtimes' spinning threads go idle
            for _ in range(min(5, args.runs - len(samples[key]))):
                s = time.perf_counter()
                fn()
                samples[key].append((time.perf_counter() - s) * 1e3)
    timing = {k: latency_stats(v) for k, v in samples.items()}
    med = {k: v["median_ms"] for k, v in timing.items()}
    rec = {"model": stem, "threads": args.threads, "calib": len(calib), "held": len(held), "preset": args.preset,
           "max_accuracy_drop": args.max_accuracy_drop,
           "activation_dtype": args.activation_dtype, "loadavg": os.getloadavg(),
           "median_ms": med, "min_ms": {k: v["min_ms"] for k, v in timing.items()},
           "ratio_forgekit_int8_vs_openvino_int8": med["forgekit-int8"] / med["openvino-int8"],
           "ratio_forgekit_int8_vs_openvino_f32": med["forgekit-int8"] / med["openvino-f32"],
           "ratio_forgekit_int8_vs_onnxruntime_fp32": med["forgekit-int8"] / med["onnxruntime-fp32"],
           "accuracy_vs_onnxruntime_fp32": accuracy, "quantize_compile_s": {"forgekit": fk_s, "nncf": nncf_s},
           "artifact": str(art.path)}
    print(f"{stem}  threads={args.threads}  calib={len(calib)}  held-out={len(held)}  "
          f"forgekit activations {args.activation_dtype}, budget {args.max_accuracy_drop}  "
          f"loadavg={rec['loadavg']}")
    for k in fns:
        print(f"  {k:18s} median {med[k]:8.2f} ms   min {timing[k]['min_ms']:8.2f} ms")
    print(f"  forgekit-int8 / openvino-int8 = {rec['ratio_forgekit_int8_vs_openvino_int8']:.2f}x   "
          f"/ openvino-f32 = {rec['ratio_forgekit_int8_vs_openvino_f32']:.2f}x   "
          f"/ onnxruntime-fp32 = {rec['ratio_forgekit_int8_vs_onnxruntime_fp32']:.2f}x")
    for k, v in accuracy.items():
        print(f"  {k:34s} {int(v) if k.endswith(COUNTS) else f'{v:.5f}'}")
    (out / f"{stem}.int8_openvino.json").write_text(json.dumps(rec, indent=2) + "\n")
    if args.profile:
        from forgekit.evaluate.bench import benchmark_artifact

        res = benchmark_artifact(art.path, model, runs=args.runs, threads=args.threads, memory=False, profile=True)
        print("  heaviest forgekit int8 kernels (separate profiling worker):")
        for row in res.extra.get("profile", [])[:args.top]:
            gf = f"{row['gflops']:7.1f} GFLOP/s" if row.get("gflops") else " " * 15
            print(f"    {row['ms']:7.3f} ms {row['share'] * 100:5.1f}%  {gf}  x{row['calls']:<3d} {row.get('rule') or '-':16s} {row['name']}")
    return rec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--calib", type=int, default=16, help="Calibration samples (seeded uniform [0, 1) images).")
    parser.add_argument("--calib-data", default=None, help="A folder of .npy samples instead.")
    parser.add_argument("--held-data", default=None, help="A folder of .npy held-out samples (all of them; default: "
                        "4 seeded uniform ones).")
    parser.add_argument("--yolo", action="store_true", help="Output 0 is a YOLO [1, 4 + C, A]: class-score "
                        "cosine and detection agreement (C = 80 is recognized without it).")
    parser.add_argument("--shape", default=None, help="The input's shape, comma-separated, where it is dynamic.")
    parser.add_argument("--max-accuracy-drop", type=float, default=None, help="forgekit's accuracy budget.")
    parser.add_argument("--calib-method", default="percentile")
    parser.add_argument("--activation-dtype", choices=("int8", "uint8"), default="int8",
                        help="forgekit's activation dtype (uint8: asymmetric where the conv does not pad).")
    parser.add_argument("--preset", choices=("performance", "mixed"), default="performance")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--target", default="host")
    parser.add_argument("--profile", action="store_true", help="Also print forgekit's heaviest int8 kernels.")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "int8_openvino"))
    args = parser.parse_args()
    # thread pools read these when they start: before any runtime is imported
    os.environ["TVM_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(args.threads)
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]  (tvm_ffi would import it: +250 MB)
    run(args)


if __name__ == "__main__":
    main()
