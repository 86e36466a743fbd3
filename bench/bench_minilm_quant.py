"""int8 accuracy and speed of all-MiniLM-L6-v2 (real weights, see make_minilm.py) on real sentences.

    .venv/bin/python bench/make_minilm.py && .venv/bin/python bench/bench_minilm_quant.py

Calibrates on 24 sentences, compares the int8 sentence embeddings with fp32 on 12 other sentences
(cosine per sentence; the acceptance bar is >= 0.99), with and without ``--max-accuracy-drop``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SENTENCES = [
    "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
    "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.", "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.", "The new movie is awesome.",
    "The cat sits outside.", "The new movie is so great.", "I love pasta with tomato sauce.",
    "Do you like pizza?", "The weather forecast says it will rain tomorrow afternoon.",
    "Stock markets fell sharply after the central bank raised interest rates.",
    "Please restart the router if the internet connection keeps dropping.",
    "The museum opens at nine and closes at five on weekdays.", "She finished the marathon in under four hours.",
    "Quantum computers use qubits instead of classical bits.", "How do I reset my password?",
    "The invoice total is due within thirty days of receipt.", "Our flight was delayed by two hours because of fog.",
    "He forgot his umbrella at the coffee shop.", "Compilers translate source code into machine instructions.",
    "The children built a sandcastle on the beach.", "Add two cups of flour and stir until smooth.",
    "The patient was discharged from the hospital on Monday.", "Electric cars are becoming more affordable.",
    "The library extended its opening hours during exams.", "A dog is running through the snow.",
    "The committee will vote on the proposal next week.", "My laptop battery drains very quickly.",
    "The river flooded the village after heavy rain.", "She is learning to play the piano.",
    "Turn left at the second traffic light.",
]


def _median_ms(f, args, runs: int) -> float:
    f(*args)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        f(*args)
        ts.append(time.perf_counter() - t)
    return float(np.median(ts) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="*", default=["entropy", "percentile", "minmax"])
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--max-accuracy-drop", type=float, default=0.005)
    parser.add_argument("--out", default=str(HERE / "results" / "minilm_quant.json"))
    args = parser.parse_args()

    import forgekit as forge
    from make_minilm import Tokenizer, model_dir

    tok = Tokenizer(model_dir() / "vocab.txt")
    data = [dict(zip(("input_ids", "attention_mask"), tok.encode(s, args.seq))) for s in SENTENCES]
    calib, held = data[:24], data[24:]
    ir = forge.from_onnx(str(HERE / "models" / "minilm.onnx"))
    f32 = ir.get_inference_function("host")
    ref = [f32(d["input_ids"], d["attention_mask"]) for d in held]
    ir.calibrate(calib)
    records = []
    for method in args.methods:
        for budget in (None, args.max_accuracy_drop):
            q = ir.copy()
            q.quantize(per_channel=True, calib_method=method, quant_type="static", max_accuracy_drop=budget)
            fq = q.get_inference_function("host")
            cos = [float(np.sum(a * fq(d["input_ids"], d["attention_mask"]))) for a, d in zip(ref, held)]  # unit vectors
            x = (held[0]["input_ids"], held[0]["attention_mask"])
            rec = {"method": method, "max_accuracy_drop": budget, "min_cosine": min(cos), "mean_cosine": float(np.mean(cos)),
                   "quantized_ops": q.quantization["quantized_ops"], "fp32_ops": q.quantization["fp32_ops"],
                   "fp32_ms": _median_ms(f32, x, args.runs), "int8_ms": _median_ms(fq, x, args.runs)}
            records.append(rec)
            print(f"minilm {method:10s} budget {budget!s:5s} min cos {rec['min_cosine']:.5f} mean {rec['mean_cosine']:.5f} "
                  f"int8 ops {rec['quantized_ops']:2d} fp32 kept {len(rec['fp32_ops']):2d} {rec['fp32_ops']}  "
                  f"fp32 {rec['fp32_ms']:6.2f} ms  int8 {rec['int8_ms']:6.2f} ms", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
