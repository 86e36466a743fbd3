"""forgekit vs onnxruntime and OpenVINO f32 on recurrent layers: the classes the loop kernel covers.

    .venv/bin/python bench/bench_recurrent.py [--only NAME ...] [--threads 2] [--runs 60] [--work DIR]

Each case is one ONNX LSTM / GRU layer built in code (seeded weights), compiled once for this CPU at level 3
(cached in ``--work``), and timed in one process against onnxruntime and OpenVINO (``INFERENCE_PRECISION_HINT
f32``), ``--threads`` threads each, in alternating blocks after a pause that lets the other runtimes' spinning
threads go idle.  It prints the median and minimum (ms) and the ratios of forgekit's median to the others';
the outputs are checked against onnxruntime first.  OpenVINO is a benchmark-only dependency (skipped when it
cannot be imported).  The cases:

* ``lstm_uni_h512``: a unidirectional LSTM, H=512, 40 steps of 256 features (a speech or language model layer:
  4 MB of recurrent weights, each step split over the threads).
* ``bilstm_h512_t8``: a bidirectional LSTM, H=512, 8 steps of 1024 features (ddddocr's CAPTCHA recognizer at
  width 64: 24 MB of weights, a direction per thread).
* ``bilstm_h512_t40``: the same at 40 steps (ddddocr at width 320).
* ``gru_uni_h256``: a unidirectional GRU, H=256, 100 steps of 257 features (a spectrogram frame model).
* ``bigru_h128``: a bidirectional GRU, H=128, 100 steps of 64 features (small: the weights stay in L2).

This shared machine is never idle: compare ratios measured side by side, not absolute numbers between runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

CASES = {  # name: (kind, direction, steps, input features, hidden)
    "lstm_uni_h512": ("LSTM", "forward", 40, 256, 512),
    "bilstm_h512_t8": ("LSTM", "bidirectional", 8, 1024, 512),
    "bilstm_h512_t40": ("LSTM", "bidirectional", 40, 1024, 512),
    "gru_uni_h256": ("GRU", "forward", 100, 257, 256),
    "bigru_h128": ("GRU", "bidirectional", 100, 64, 128),
}


def _model(kind: str, direction: str, features: int, hidden: int):
    from onnx import TensorProto, helper, numpy_helper

    gates = {"LSTM": 4, "GRU": 3}[kind]
    dirs = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(hidden)  # PyTorch's initialization range: the state neither saturates nor dies
    inits = [numpy_helper.from_array(rng.uniform(-scale, scale, shape).astype(np.float32), name)
             for name, shape in (("W", (dirs, gates * hidden, features)), ("R", (dirs, gates * hidden, hidden)),
                                 ("B", (dirs, 2 * gates * hidden)))]
    attrs = {"linear_before_reset": 1} if kind == "GRU" else {}
    node = helper.make_node(kind, ["x", "W", "R", "B"], ["y"], hidden_size=hidden, direction=direction, **attrs)
    graph = helper.make_graph([node], kind.lower(), [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   ["T", 1, features])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def _time(fns: dict, runs: int) -> dict[str, list[float]]:
    for fn in fns.values():
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    while any(len(v) < runs for v in samples.values()):
        for key, fn in fns.items():
            time.sleep(0.05)  # lets the other runtimes' spinning threads go idle
            for _ in range(min(10, runs - len(samples[key]))):
                start = time.perf_counter()
                fn()
                samples[key].append((time.perf_counter() - start) * 1e3)
    return samples


def run_case(name: str, args: argparse.Namespace) -> dict[str, float]:
    import onnx
    import onnxruntime as ort

    import forgekit

    kind, direction, steps, features, hidden = CASES[name]
    work = Path(args.work) / name
    work.mkdir(parents=True, exist_ok=True)
    path = work / "model.onnx"
    onnx.save(_model(kind, direction, features, hidden), path)
    artifact = work / "artifact"
    if not (artifact / "metadata.json").exists():
        forgekit.from_onnx(str(path)).compile("host", output_path=str(artifact), opt_level=3, force_overwrite=True)
    engine = forgekit.Engine(str(artifact))
    x = np.random.default_rng(1).standard_normal((steps, 1, features)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x})[0]
    err = float(np.abs(engine.infer(x)[0] - ref).max())
    fns = {"forgekit": engine.prepared_call(x), "onnxruntime": lambda: sess.run(None, {"x": x})}
    try:
        import openvino as ov

        cfg = {"INFERENCE_NUM_THREADS": args.threads, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
        request = ov.Core().compile_model(str(path), "CPU", cfg).create_infer_request()
        fns["openvino-f32"] = lambda: request.infer({0: x})
    except ImportError:
        pass
    samples = _time(fns, args.runs)
    med = {k: statistics.median(v) for k, v in samples.items()}
    row = f"{name:16s} err {err:.1e}  " + "  ".join(f"{k} {med[k]:.3f} (min {min(samples[k]):.3f})" for k in med)
    ratios = "  ".join(f"/ {k} {med['forgekit'] / med[k]:.2f}x" for k in med if k != "forgekit")
    print(f"{row}  ms   forgekit {ratios}", flush=True)
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=sorted(CASES), help="only these cases")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=60, help="timed calls per runtime")
    ap.add_argument("--work", default="/tmp/forgekit-bench-recurrent", help="models and artifacts (cached)")
    args = ap.parse_args()
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    print(f"loadavg {os.getloadavg()}, {args.threads} threads", flush=True)
    for name in args.only or CASES:
        run_case(name, args)


if __name__ == "__main__":
    sys.exit(main())
