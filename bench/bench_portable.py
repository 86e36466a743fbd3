"""The portable target (``x86-64``: kernels for x86-64-v2/v3/v4 in one artifact, chosen at load time) vs a
``host`` build, per level, with onnxruntime in the same run.

    .venv/bin/python bench/make_models.py && .venv/bin/python bench/make_models_numpy.py
    .venv/bin/python bench/bench_portable.py [MODEL ...] [--threads 2] [--runs 30] [--out bench/results]

MODEL: a name in bench/models/, an .onnx path or sample:NAME (default: squeezenet resnet50 mobilenetv2).
Each level is timed by loading the one artifact with ``FORGEKIT_LEVEL`` set (what the loader would pick on
a CPU of that level); "auto" is what this CPU picks.  Prints compile seconds and library sizes, the
median latency of every variant, the ratio to ``host`` and to onnxruntime, and the max error vs ORT.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
DEFAULT_MODELS = ["squeezenet", "resnet50", "mobilenetv2"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # before the runtime library is loaded

    import numpy as np
    from bench_models import model_path

    import forgekit
    from forgekit.evaluate import reference
    from forgekit.runtime import Engine
    from forgekit.runtime.compat import LEVEL_ENV
    from forgekit.runtime.cpu import host_features
    from forgekit.runtime.stats import time_calls

    rows = []
    work = Path(tempfile.mkdtemp(prefix="forgekit-portable-"))
    try:
        for name in args.models:
            path = model_path(name)
            ir = forgekit.from_onnx(path)
            built = {}
            for label, target in (("host", "host"), ("portable", "x86-64")):
                start = time.perf_counter()
                built[label] = ir.compile(target=target, output_path=work / f"{path.stem}-{label}")
                built[label + "_s"] = round(time.perf_counter() - start, 1)
            meta = built["portable"].metadata
            levels = [v["name"] for v in meta["library"]["variants"]]
            sizes = {v["name"]: v["size"] for v in meta["library"]["variants"]}
            if meta["library"].get("weights"):  # the arrays the levels share, stored once
                sizes["shared weights"] = meta["library"]["weights"]["size"]
            engines = {"host": Engine(built["host"].path), "auto": Engine(built["portable"].path)}
            for level in levels:
                needs = next(v["cpu_features"] for v in meta["library"]["variants"] if v["name"] == level)
                if not set(needs) <= host_features():
                    continue
                os.environ[LEVEL_ENV] = level
                try:
                    engines[level] = Engine(built["portable"].path)
                finally:
                    del os.environ[LEVEL_ENV]
            inputs = engines["host"].example_inputs(seed=1)
            sess = reference.session(path, threads=args.threads)
            fed = reference.feeds(sess, engines["host"].input_names, inputs)
            expected = reference.run(sess, fed)
            calls = {label: e.prepared_call(*inputs) for label, e in engines.items()}
            calls["onnxruntime"] = lambda s=sess, f=fed: s.run(None, f)
            times: dict[str, list[float]] = {k: [] for k in calls}
            for _ in range(3):  # interleaved rounds: drift on a shared machine hits every variant alike
                for label, call in calls.items():
                    times[label] += time_calls(call, max(1, args.runs // 3), warmup=2)
            med = {k: float(np.median(v)) for k, v in times.items()}
            errors = {label: max(float(np.max(np.abs(a - b))) for a, b in zip(e.infer(*inputs), expected))
                      for label, e in engines.items()}
            row = {"model": path.stem, "chosen": engines["auto"].level, "compile_s": {k: built[k + "_s"]
                   for k in ("host", "portable")}, "sizes": sizes, "median_ms": med, "max_abs_err": errors}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lines = ["| model | level | median ms | / host | / onnxruntime | max abs err vs ORT |", "|---|---|---|---|---|---|"]
    for row in rows:
        med = row["median_ms"]
        for label in [k for k in med if k != "onnxruntime"]:
            shown = f"auto ({row['chosen']})" if label == "auto" else label
            err = row["max_abs_err"].get(label, float("nan"))
            lines.append(f"| {row['model']} | {shown} | {med[label]:.2f} | {med[label] / med['host']:.2f}x | "
                         f"{med[label] / med['onnxruntime']:.2f}x | {err:.1e} |")
        lines.append(f"| {row['model']} | onnxruntime | {med['onnxruntime']:.2f} | | | |")
        lines.append(f"| {row['model']} | compile s (host / portable) | {row['compile_s']['host']} / "
                     f"{row['compile_s']['portable']} | | | |")
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "portable.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "portable.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
