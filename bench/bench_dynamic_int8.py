"""int8 against fp32 with the image size left dynamic (issue 39: int8 must never lose to fp32).

    .venv/bin/python bench/bench_dynamic_int8.py [--runs 20] [--threads 2] [--case det]

Cases: ``det``, PP-OCRv6 det (rapidocr 3.10.0; ``bench/pypi_corpus/fetch.py`` puts it in
bench/models/pypi_corpus/), its H and W dynamic in multiples of 32; ``yolo``, NudeNet 320n (a YOLOv8n detector,
nudenet 3.4.2, same place), likewise; ``net``, a 6-conv ReLU net with a global
mean built here, H and W dynamic.  For each: fp32 and int8 (static, calibrated on 8 synthetic images of the
kind the model reads) with the size dynamic, and both pinned to the first size; every artifact timed in three
interleaved rounds in this one process (best of the rounds' medians), and int8 judged against onnxruntime's
fp32 (cosine; for the text detector also the share of pixels on the same side of its 0.3 threshold, for
YOLO the cosine of the class scores alone, which the box coordinates would otherwise dominate).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _text_images(rng: np.random.Generator, n: int, h: int, w: int) -> np.ndarray:
    """Light pages with dark text-line strokes, normalized as PP-OCR does ((x - 0.5) / 0.5)."""
    out = np.full((n, 3, h, w), 0.9, np.float32)
    for im in out:
        for _ in range(12):
            y, x = rng.integers(0, h - 12), rng.integers(0, w - 40)
            im[:, y:y + rng.integers(6, 12), x:x + rng.integers(20, min(200, w - x))] = rng.uniform(0, 0.3)
    out += rng.normal(0, 0.03, out.shape).astype(np.float32)
    return (out - 0.5) / 0.5


def _photos(rng: np.random.Generator, n: int, h: int, w: int) -> np.ndarray:
    """Photo-like images in [0, 1]: smooth colour fields (a coarse grid, upsampled) with bright and dark blobs."""
    coarse = rng.uniform(0.1, 0.9, (n, 3, h // 32 + 1, w // 32 + 1)).astype(np.float32)
    out = np.repeat(np.repeat(coarse, 32, axis=2), 32, axis=3)[:, :, :h, :w].copy()
    yy, xx = np.mgrid[:h, :w]
    for im in out:
        for _ in range(6):
            cy, cx, r = rng.integers(0, h), rng.integers(0, w), rng.integers(h // 12, h // 4)
            im[:, (yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 1, (3, 1))
    return np.clip(out + rng.normal(0, 0.02, out.shape), 0, 1).astype(np.float32)


def _net():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i, (ci, co, s) in enumerate([(3, 32, 2), (32, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1),
                                     (128, 128, 1)]):
        inits += [numpy_helper.from_array((rng.standard_normal((co, ci, 3, 3)) / np.sqrt(ci * 9)).astype(np.float32),
                                          f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(co) * 0.1).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1] * 4, strides=[s, s]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        prev = f"r{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [prev], ["y"]))
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


#: name -> (model, input name, dynamic ranges (H's name first), sizes (H, W), calibration images)
CASES = {
    "yolo": (lambda: str(HERE / "models" / "pypi_corpus" / "nudenet_320n.onnx"), "images",
             {"height": "32..2048:32", "width": "32..2048:32"}, [(320, 320), (480, 640)], _photos),
    "det": (lambda: str(HERE / "models" / "pypi_corpus" / "ppocrv6_det_small.onnx"), "x",
            {"H": "32..2048:32", "W": "32..2048:32"}, [(480, 640), (320, 960)], _text_images),
    "net": (_net, "x", {"H": "32..512", "W": "32..512"}, [(128, 160), (57, 93)],
            lambda rng, n, h, w: rng.standard_normal((n, 3, h, w)).astype(np.float32)),
}


def _median_ms(fn, runs: int) -> float:
    from forgekit.runtime.stats import time_calls

    return float(np.median(time_calls(fn, runs, warmup=3)))


def run_case(name: str, runs: int, threads: int, out: Path) -> None:
    import onnxruntime as ort

    import forgekit
    from forgekit.runtime import Engine

    make, key, dynamic, sizes, images = CASES[name]
    model = make()
    rng = np.random.default_rng(1)
    calib = images(rng, 8, *sizes[0])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model if isinstance(model, str) else model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    engines = {}
    for pinned in (False, True):
        for prec in ("fp32", "int8"):
            shapes = {key: [1, 3, *sizes[0]]} if pinned else {key: [1, 3, *dynamic]}
            ir = forgekit.from_onnx(model, shapes, dynamic=None if pinned else dynamic)
            if prec == "int8":
                ir.calibrate([{key: c[None]} for c in calib])
                ir.quantize(quant_type="static", per_channel=True)
            tag = f"{prec} {'pinned' if pinned else 'dynamic'}"
            engines[tag] = Engine(ir.compile("host", output_path=out / f"{name}_{tag.replace(' ', '_')}").path)
    print(f"\n{name}: ms (best of 3 interleaved medians of {runs} calls, {threads} threads)")
    print("| size | fp32 dynamic | int8 dynamic | int8/fp32 | fp32 pinned | int8 pinned | onnxruntime | "
          "int8 cosine | int8 mask agreement or scores |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        x = images(np.random.default_rng(2), 1, *size)
        ref = session.run(None, {key: x})[0]
        got = np.asarray(engines["int8 dynamic"].infer(x)[0])
        a, b = got.ravel().astype(np.float64), ref.ravel().astype(np.float64)
        cosine = a @ b / np.linalg.norm(a) / np.linalg.norm(b)
        mask = f"{np.mean((a > 0.3) == (b > 0.3)):.4f}" if name == "det" else "-"
        if name == "yolo":  # rows 4.. are the class scores
            sa, sb = got[0, 4:].ravel().astype(np.float64), ref[0, 4:].ravel().astype(np.float64)
            mask = f"scores cosine {sa @ sb / np.linalg.norm(sa) / np.linalg.norm(sb):.4f}"
        timed = {tag: e for tag, e in engines.items() if size == sizes[0] or "dynamic" in tag}
        best = {tag: min(_median_ms(lambda e=e: e.infer(x), runs) for _ in range(3)) for tag, e in timed.items()}
        t_ort = min(_median_ms(lambda: session.run(None, {key: x}), runs) for _ in range(3))
        pinned = [f"{best[t]:.2f}" if t in best else "-" for t in ("fp32 pinned", "int8 pinned")]
        print(f"| {size[0]}x{size[1]} | {best['fp32 dynamic']:.2f} | {best['int8 dynamic']:.2f} | "
              f"{best['int8 dynamic'] / best['fp32 dynamic']:.2f} | {pinned[0]} | {pinned[1]} | {t_ort:.2f} | "
              f"{cosine:.4f} | {mask} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.case or list(CASES):
            run_case(name, args.runs, args.threads, Path(tmp))


if __name__ == "__main__":
    main()
