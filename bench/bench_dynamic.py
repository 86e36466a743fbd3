"""One artifact for every size: a model compiled once with a dynamic dimension, timed at several sizes
against an artifact compiled for each size and against onnxruntime, with the largest error vs onnxruntime.

    .venv/bin/python bench/bench_dynamic.py                 # the default cases below, 2 threads
    .venv/bin/python bench/bench_dynamic.py --case rec      # one of them

Needs bench/models/{bert_dyn,cnn_dyn}.onnx (bench/make_models_torch.py) and rapidocr_onnxruntime (PP-OCRv4
rec).  Latency is the best of three interleaved medians of --runs calls, every runtime in this one process.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _rec_model() -> str:
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")  # not imported: it needs OpenCV
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("PP-OCRv4 rec comes with rapidocr_onnxruntime: pip install rapidocr-onnxruntime==1.4.4")
    return str(Path(spec.submodule_search_locations[0]) / "models" / "ch_PP-OCRv4_rec_infer.onnx")


#: name -> (model, {input: dims with the symbol}, symbol, sizes, range)
CASES = {
    "rec": (_rec_model, {"x": [1, 3, 48, "W"]}, "W", (160, 320, 960), "32..2048"),
    "bert": (lambda: str(HERE / "models" / "bert_dyn.onnx"), {"input_ids": [1, "S"], "attention_mask": [1, "S"]},
             "S", (16, 77, 128), "1..512"),
    "cnn": (lambda: str(HERE / "models" / "cnn_dyn.onnx"), {"x": ["N", 3, 224, 224]}, "N", (1, 3, 8), "1..8"),
}


def _inputs(session, shapes: dict, symbol: str, size: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in session.get_inputs():
        shape = [size if d == symbol else d for d in shapes[inp.name]]
        if "int" in inp.type:
            feeds[inp.name] = (np.ones(shape, np.int64) if "mask" in inp.name
                               else rng.integers(0, 1000, shape).astype(np.int64))
        else:
            feeds[inp.name] = rng.random(shape, dtype=np.float32)
    return feeds


def _median_ms(fn, runs: int, warmup: int = 3) -> float:
    from forgekit.runtime.stats import time_calls  # the runtime's own timer

    return float(np.median(time_calls(fn, runs, warmup)))


def run_case(name: str, runs: int, threads: int, out: Path) -> list[str]:
    import onnxruntime as ort

    import forgekit
    from forgekit.runtime import Engine

    make, shapes, symbol, sizes, bounds = CASES[name]
    model = make()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    forgekit.from_onnx(model, shapes, dynamic={symbol: bounds}).compile(
        "x86-64", output_path=out / f"{name}_dyn", force_overwrite=True)
    dyn_compile = time.perf_counter() - start
    dynamic = Engine(out / f"{name}_dyn")
    rows = []
    for size in sizes:
        static_shapes = {k: [size if d == symbol else d for d in v] for k, v in shapes.items()}
        start = time.perf_counter()
        forgekit.from_onnx(model, static_shapes).compile("x86-64", output_path=out / f"{name}_{size}",
                                                         force_overwrite=True)
        static_compile = time.perf_counter() - start
        static = Engine(out / f"{name}_{size}")
        feeds = _inputs(session, shapes, symbol, size)
        args = [feeds[i.name] for i in session.get_inputs()]
        ref = session.run(None, feeds)[0]
        err = float(np.abs(dynamic.infer(*args)[0] - ref).max())
        # three interleaved rounds, the best median of each: this shared machine drifts within seconds
        rounds = [(_median_ms(lambda: dynamic.infer(*args), runs), _median_ms(lambda: static.infer(*args), runs),
                   _median_ms(lambda: session.run(None, feeds), runs)) for _ in range(3)]
        t_dyn, t_static, t_ort = (min(r[i] for r in rounds) for i in range(3))
        rows.append(f"| {name} | {symbol}={size} | {t_dyn:.2f} | {t_static:.2f} | {t_ort:.2f} | "
                    f"{t_dyn / t_static:.2f}x | {t_dyn / t_ort:.2f}x | {err:.1e} | {dyn_compile:.0f} s / "
                    f"{static_compile:.0f} s |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    print("| model | size | dynamic ms | static ms | onnxruntime ms | dynamic/static | dynamic/ort | max err | "
          "compile dynamic / static |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.case or list(CASES):
            run_case(name, args.runs, args.threads, Path(tmp))


if __name__ == "__main__":
    main()
