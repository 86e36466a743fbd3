"""int8 accuracy and speed on real-weight models: PP-OCR det/rec/cls (``rapidocr-onnxruntime`` wheel)
on rendered text images.

    .venv/bin/pip install pillow rapidocr-onnxruntime==1.4.4 --no-deps   # bench-only
    .venv/bin/python bench/bench_ppocr_quant.py [--models det rec cls] [--methods entropy percentile]

For every model and calibration method: calibrate on ``--calib`` rendered text images, quantize (static,
per-channel), and compare with fp32 on held-out images: output cosine (min and mean over images; the
acceptance bar is >= 0.99), the task metric (cls: top-1 agreement; rec: CTC greedy-decoded text identical
to fp32's, and the character error rate between the two decodes), the per-layer report, the layers
``--max-accuracy-drop`` keeps in fp32, and median latency of both builds (in-process, same inputs).
``--ort-int8`` adds the anchor: onnxruntime's own ``quantize_static`` (QDQ, per-channel, its Percentile
calibration, same images) judged the same way against onnxruntime fp32.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import time
from pathlib import Path

import numpy as np

WORDS = ("invoice total amount due receipt order number customer address street city phone email "
         "date time quantity price tax discount subtotal payment cash card change thank you visit again "
         "ACME Corp 2024 No. 31415 Main St. Springfield $12.50 45.00 EUR 7.99 TEL +1-555-0100").split()
MODELS = {  # name -> (file, input shape, normalization mean, std)
    "det": ("ch_PP-OCRv4_det_infer.onnx", (1, 3, 320, 320), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "rec": ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}


def render(shape: tuple[int, ...], rng: random.Random, lines: int) -> np.ndarray:
    """A text image (dark words on a light, slightly noisy background; random size/position/rotation 180)."""
    from PIL import Image, ImageDraw, ImageFont

    _, _, h, w = shape
    bg = tuple(rng.randint(200, 255) for _ in range(3))
    img = Image.new("RGB", (w, h), bg)
    draw = ImageDraw.Draw(img)
    for i in range(lines):
        size = rng.randint(int(h / lines * 0.45), max(int(h / lines * 0.8), 8))
        font = ImageFont.load_default(size=size)
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
        y = int(i * h / lines + rng.randint(0, max(1, int(h / lines - size))))
        draw.text((rng.randint(0, max(1, w // 8)), y), text, fill=tuple(rng.randint(0, 80) for _ in range(3)), font=font)
    if rng.random() < 0.3:
        img = img.rotate(180)
    arr = np.asarray(img, np.float32) / 255.0
    arr = arr + np.random.default_rng(rng.randint(0, 1 << 30)).normal(0, 0.02, arr.shape).astype(np.float32)
    return arr


def inputs(name: str, n: int, seed: int) -> list[np.ndarray]:
    _, shape, mean, std = MODELS[name]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        img = render(shape, rng, lines=8 if name == "det" else 1)
        x = (img - np.array(mean, np.float32)) / np.array(std, np.float32)
        out.append(np.ascontiguousarray(x.transpose(2, 0, 1)[None], np.float32))
    return out


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def ctc_greedy(probs: np.ndarray) -> list[int]:
    """PP-OCR rec decoding: argmax per time step, repeats merged, blanks (class 0) dropped."""
    out, prev = [], -1
    for i in probs.reshape(-1, probs.shape[-1]).argmax(-1):
        if i != prev and i != 0:
            out.append(int(i))
        prev = i
    return out


def edit_distance(a: list[int], b: list[int]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def agreement(name: str, ref: list[np.ndarray], got: list[np.ndarray]) -> dict:
    """How the quantized outputs agree with fp32: cosine per image, and the model's task metric."""
    cos = [_cos(a, b) for a, b in zip(ref, got)]
    rec = {"min_cosine": min(cos), "mean_cosine": float(np.mean(cos))}
    if name == "cls":
        rec["top1_agreement"] = float(np.mean([a.argmax() == b.argmax() for a, b in zip(ref, got)]))
    if name == "rec":
        texts = [(ctc_greedy(a), ctc_greedy(b)) for a, b in zip(ref, got)]
        rec["identical_text"] = float(np.mean([a == b for a, b in texts]))
        rec["cer"] = sum(edit_distance(a, b) for a, b in texts) / max(1, sum(len(a) for a, _ in texts))
    return rec


def _line(rec: dict) -> str:
    return (f"min cos {rec['min_cosine']:.5f} mean {rec['mean_cosine']:.5f}"
            + (f"  top1 {rec['top1_agreement']:.3f}" if "top1_agreement" in rec else "")
            + (f"  same text {rec['identical_text']:.3f} CER {rec['cer']:.4f}" if "cer" in rec else ""))


def _median_ms(f, x, runs: int) -> float:
    f(x)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f(x)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--methods", nargs="*", default=["entropy", "percentile"])
    parser.add_argument("--calib", type=int, default=64)  # 16 measured too few: held-out cosine swings
    parser.add_argument("--held-out", type=int, default=16)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--max-accuracy-drop", type=float, default=0.01)
    parser.add_argument("--ort-int8", action="store_true",
                        help="Also judge onnxruntime's quantize_static (QDQ, per-channel, Percentile) the same way.")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "ppocr_quant.json"))
    args = parser.parse_args()

    import forgekit as forge

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None:
        raise SystemExit("rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime==1.4.4)")
    models_dir = Path(spec.origin).parent / "models"
    records = []
    for name in args.models:
        fname, shape, _, _ = MODELS[name]
        calib, held = inputs(name, args.calib, 0), inputs(name, args.held_out, 1)
        ir = forge.from_onnx(str(models_dir / fname), {"x": list(shape)})
        f32 = ir.get_inference_function("host")
        ref = [f32(x) for x in held]
        ref = [r[0] if isinstance(r, list) else r for r in ref]
        ir.calibrate(calib)
        for method in args.methods:
            for budget in (None, args.max_accuracy_drop):
                q = ir.copy()
                q.quantize(per_channel=True, calib_method=method, quant_type="static", max_accuracy_drop=budget)
                fq = q.get_inference_function("host")
                got = [fq(x) for x in held]
                got = [g[0] if isinstance(g, list) else g for g in got]
                rec = {"model": name, "method": method, "max_accuracy_drop": budget, **agreement(name, ref, got),
                       "quantized_ops": q.quantization["quantized_ops"], "fp32_ops": q.quantization["fp32_ops"],
                       "fp32_ms": _median_ms(f32, held[0], args.runs), "int8_ms": _median_ms(fq, held[0], args.runs)}
                if q.quantization_report is not None:
                    rec["report_drop"] = q.quantization_report["accuracy_drop"]
                    rec["worst_layers"] = sorted(q.quantization_report["layers"], key=lambda l: l["snr_db"])[:3]
                records.append(rec)
                print(f"{name:4s} {method:10s} budget {budget!s:5s} {_line(rec)}  "
                      f"int8 ops {rec['quantized_ops']:3d} fp32 kept {len(rec['fp32_ops']):2d}  "
                      f"fp32 {rec['fp32_ms']:7.2f} ms  int8 {rec['int8_ms']:7.2f} ms", flush=True)
        if args.ort_int8:
            records.append(_ort_anchor(name, models_dir / fname, calib, held, Path(args.out).parent))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(records, indent=2) + "\n")


def _ort_anchor(name: str, path: Path, calib: list[np.ndarray], held: list[np.ndarray], out: Path) -> dict:
    """onnxruntime int8 (its quantize_static) vs onnxruntime fp32 on the same held-out images."""
    import onnxruntime as ort

    from bench_quantize import _ort_int8

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = sess.get_inputs()[0].name
    qpath = _ort_int8(path, calib, feed, out, per_channel=True, method="Percentile")
    if qpath is None:
        return {"model": name, "method": "onnxruntime quantize_static", "failed": True}
    q = ort.InferenceSession(str(qpath), providers=["CPUExecutionProvider"])
    ref = [sess.run(None, {feed: x})[0] for x in held]
    rec = {"model": name, "method": "onnxruntime quantize_static (percentile)",
           **agreement(name, ref, [q.run(None, {feed: x})[0] for x in held])}
    print(f"{name:4s} onnxruntime int8 (quantize_static, percentile) {_line(rec)}", flush=True)
    return rec


if __name__ == "__main__":
    main()
