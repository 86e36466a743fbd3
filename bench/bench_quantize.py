"""forgekit int8 vs forgekit fp32 vs onnxruntime fp32 (and onnxruntime int8 QDQ) on the same models.

    .venv/bin/python bench/bench_quantize.py [MODEL ...] [--calib N] [--calib-method percentile]
                                             [--per-channel/--no-per-channel] [--runs 30] [--ort-int8]
    .venv/bin/python bench/bench_models.py --quantize [MODEL ...]      # the same

For each model: import, compile fp32, calibrate on ``--calib`` random normal samples (or ``--calib-data``),
quantize (static), compile int8, then time both artifacts against onnxruntime with
:func:`forgekit.bench.benchmark_artifact` (alternating blocks in one worker, same threads) and report the
fp32/int8 speed-up and the cosine/top-1 agreement of the int8 outputs with fp32 on held-out inputs.
Random weights and random inputs only measure speed and numerical agreement, not task accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _ort_int8(path: Path, calib: list[np.ndarray], name: str, out: Path, per_channel: bool,
              method: str = "MinMax") -> Path | None:
    """onnxruntime's own static QDQ quantization of the model, calibrated with its ``CalibrationMethod``
    ``method`` (None when it fails)."""
    try:
        from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                              quantize_static)
    except ImportError:
        return None

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{name: x} for x in calib])

        def get_next(self):  # noqa: ANN201 - onnxruntime's interface
            return next(self.it, None)

    dst = out / f"{path.stem}.ort_int8.onnx"
    try:
        quantize_static(str(path), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=getattr(CalibrationMethod, method))
    except Exception as exc:  # noqa: BLE001 - optional column
        print(f"  onnxruntime quantize_static failed: {exc}")
        return None
    return dst


def _ort_time(path: Path, x: np.ndarray, name: str, threads: int, runs: int) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(3):
        sess.run(None, {name: x})
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, {name: x})
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def run(models: list[str], args: argparse.Namespace) -> list[dict]:
    import forgekit as forge
    from forgekit.evaluate.bench import benchmark_artifact
    from forgekit.runtime import Engine
    from forgekit.targets import parse_target

    from bench_models import expose_logits, model_path

    out = Path(args.out)
    (out / "artifacts").mkdir(parents=True, exist_ok=True)
    target = {**parse_target(args.target).target, "num-cores": args.threads}
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  target={target}  threads={args.threads}  "
          f"loadavg={os.getloadavg()}", flush=True)
    records = []
    for model in models:
        path = expose_logits(model_path(model), out / "artifacts")
        stem = Path(model).stem.replace("sample:", "")
        ir = forge.from_onnx(str(path))
        shape = [d if isinstance(d, int) else 1 for d in ir.input_shapes[0]]
        rng = np.random.default_rng(0)
        if len(ir.input_names) == 1 and ir.input_dtypes[0] == "float32":
            def sample() -> list[np.ndarray]:
                return [rng.standard_normal(shape).astype(np.float32)]
        else:  # token ids inside the vocabulary, attention masks, ... (a BERT-style encoder)
            import onnx

            from forgekit.testing.zoo import example_feeds

            proto, seeds = onnx.load(str(path)), iter(range(1_000_000))

            def sample() -> list[np.ndarray]:
                feeds = example_feeds(proto, seed=next(seeds))
                return [feeds[n] for n in ir.input_names]
        calib = args.calib_data or [sample() for _ in range(args.calib)]
        fp32 = ir.compile(target=target, output_path=out / "artifacts" / f"{stem}.fp32", opt_level=args.opt_level,
                          force_overwrite=True)
        start = time.perf_counter()
        ir.calibrate(calib)
        ir.quantize(per_channel=args.per_channel, calib_method=args.calib_method, quant_type="static")
        int8 = ir.compile(target=target, output_path=out / "artifacts" / f"{stem}.int8", opt_level=args.opt_level,
                          force_overwrite=True)
        quant_s = time.perf_counter() - start
        b32 = benchmark_artifact(fp32.path, path, runs=args.runs, threads=args.threads, memory=False)
        b8 = benchmark_artifact(int8.path, path, runs=args.runs, threads=args.threads, memory=False)
        e32, e8 = Engine(fp32.path), Engine(int8.path)
        held = [sample() for _ in range(4)]
        cos, top1 = [], []
        for x in held:
            a, b = e32.infer(*x)[-1], e8.infer(*x)[-1]  # the logits when the model ends in a softmax
            cos.append(_cos(a, b))
            if a.ndim == 2:
                top1.append(float(np.mean(a.argmax(-1) == b.argmax(-1))))
        ort_fp32 = (b32.onnxruntime.median_ms + b8.onnxruntime.median_ms) / 2
        rec = {"model": stem, "forgekit_fp32_ms": b32.forgekit.median_ms, "forgekit_int8_ms": b8.forgekit.median_ms,
               "onnxruntime_fp32_ms": ort_fp32, "int8_speedup_vs_fp32": b32.forgekit.median_ms / b8.forgekit.median_ms,
               "int8_vs_ort_fp32": ort_fp32 / b8.forgekit.median_ms, "cosine_vs_fp32": min(cos),
               # fp32 and int8 are timed in two worker runs; onnxruntime, timed in both, normalizes the drift
               "int8_speedup_ort_normalized": (b32.forgekit.median_ms / b32.onnxruntime.median_ms)
               / (b8.forgekit.median_ms / b8.onnxruntime.median_ms),
               "onnxruntime_fp32_ms_runs": [b32.onnxruntime.median_ms, b8.onnxruntime.median_ms],
               "top1_agreement": float(np.mean(top1)) if top1 else None, "quantize_compile_s": round(quant_s, 1),
               "quantization": {k: v for k, v in ir.quantization.items() if k != "layers"}}
        if args.ort_int8:
            qpath = _ort_int8(path, [c[0] for c in calib[:8]], ir.input_names[0], out / "artifacts", args.per_channel)
            if qpath is not None:
                try:
                    rec["onnxruntime_int8_ms"] = _ort_time(qpath, held[0][0], ir.input_names[0], args.threads, args.runs)
                except Exception as exc:  # noqa: BLE001 - e.g. quantize_static wrote an invalid opset-9 model
                    print(f"  onnxruntime int8 model does not load: {str(exc).splitlines()[0][:160]}")
        records.append(rec)
        print(f"{stem:12s} fp32 {rec['forgekit_fp32_ms']:8.2f} ms  int8 {rec['forgekit_int8_ms']:8.2f} ms  "
              f"ort fp32 {ort_fp32:8.2f} ms  {'ort int8 %8.2f ms  ' % rec['onnxruntime_int8_ms'] if 'onnxruntime_int8_ms' in rec else ''}"
              f"int8/fp32 speed-up {rec['int8_speedup_vs_fp32']:4.2f}x (ort-normalized {rec['int8_speedup_ort_normalized']:4.2f}x)  "
              f"vs ort {rec['int8_vs_ort_fp32']:4.2f}x  "
              f"cos {rec['cosine_vs_fp32']:.4f}  top1 {rec['top1_agreement']}", flush=True)
    print(f"loadavg at end: {os.getloadavg()}")
    (out / "quantize_results.json").write_text(json.dumps(records, indent=2) + "\n")
    return records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calib", type=int, default=8, help="Random calibration samples.")
    parser.add_argument("--calib-data", default=None, help="Calibration data path (.npy/.npz/folder) instead.")
    parser.add_argument("--calib-method", default="percentile")
    parser.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--ort-int8", action="store_true", help="Also time onnxruntime's quantize_static QDQ model.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["resnet50", "squeezenet", "resnet18", "mobilenetv2"])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--opt-level", type=int, default=3)
    parser.add_argument("--target", default="host")
    parser.add_argument("--out", default=str(HERE / "results"))
    add_arguments(parser)
    run(parser.parse_args().models, parser.parse_args())


if __name__ == "__main__":
    main()
