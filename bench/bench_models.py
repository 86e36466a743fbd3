"""forgekit vs onnxruntime over a list of models: compile each for this CPU, then time both runtimes
side by side (same threads, same inputs, same run), check the outputs, and print/write the ratios.

    .venv/bin/python bench/make_models.py                  # once: writes bench/models/*.onnx
    .venv/bin/python bench/bench_models.py [MODEL ...] [--threads 2] [--runs 30] [--opt-level 3]
                                           [--tune-trials N] [--out bench/results]

MODEL is a name in bench/models/ (resnet50, squeezenet, resnet18, mobilenetv2, bert4l: the default
list), an .onnx path, or sample:NAME.  Writes ``results.json`` and ``results.md`` under ``--out``.
Timings on shared machines drift by ±30 % between runs: compare ratios, which are measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_MODELS = ["resnet50", "squeezenet", "resnet18", "mobilenetv2", "bert4l"]


def model_path(name: str) -> Path:
    from forgekit.samples import PREFIX, resolve

    if name.startswith(PREFIX) or name.endswith(".onnx"):
        return Path(resolve(name))
    path = HERE / "models" / f"{name}.onnx"
    if not path.exists():
        sys.exit(f"error: {path} does not exist: run bench/make_models.py first")
    return path


def expose_logits(path: Path, work: Path) -> Path:
    """If the graph ends in Softmax, also output the logits: a saturated softmax (random-weight ResNet-50
    is one-hot) would make the output comparison meaningless."""
    import onnx

    model = onnx.load(path)
    last = model.graph.node[-1]
    if last.op_type != "Softmax" or len(model.graph.output) != 1:
        return path
    model.graph.output.append(onnx.helper.make_tensor_value_info(last.input[0], onnx.TensorProto.FLOAT, None))
    out = work / f"{path.stem}.logits.onnx"
    onnx.save(model, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--opt-level", type=int, default=3)
    parser.add_argument("--target", default="host")
    parser.add_argument("--tune-trials", type=int, default=None, help="MetaSchedule trials per model (with records).")
    parser.add_argument("--records", default=None, help="Tuning records directory (default: the user cache).")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--quantize", action="store_true", help="int8 vs fp32 vs onnxruntime (bench_quantize.py).")
    parser.add_argument("--peer", action="append", default=[], help="Also time openvino (f32 and its default "
                        "precision) in the same run. Repeatable.")
    import bench_quantize

    bench_quantize.add_arguments(parser)
    args = parser.parse_args()
    if args.quantize:
        bench_quantize.run([m for m in args.models if (HERE / "models" / f"{m}.onnx").exists() or "." in m], args)
        return

    import forgekit as forge
    from forgekit.evaluate.bench import benchmark_artifact, markdown_table

    out = Path(args.out)
    (out / "artifacts").mkdir(parents=True, exist_ok=True)
    from forgekit.targets import parse_target

    spec = parse_target(args.target)
    # a portable target stays a name (a dict of its baseline would build one level); others get the core count
    target = args.target if spec.levels else {**spec.target, "num-cores": args.threads}
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  target={target}  threads={args.threads}  "
          f"loadavg={os.getloadavg()}", flush=True)
    rows, records = [], []
    for name in args.models:
        path = expose_logits(model_path(name), out / "artifacts")
        stem = Path(name).stem.replace("sample:", "")
        options = {}
        if args.tune_trials is not None:
            options = {"tuning_trials": args.tune_trials, "records": args.records}
        start = time.perf_counter()
        ir = forge.from_onnx(str(path))
        result = ir.compile(target=target, output_path=out / "artifacts" / stem, opt_level=args.opt_level,
                            force_overwrite=True, **options)
        compile_s = time.perf_counter() - start
        bench = benchmark_artifact(result.path, path, runs=args.runs, threads=args.threads, peers=args.peer)
        bench.compile_seconds = round(compile_s, 2)  # import + passes + codegen + link, wall clock
        rows.append((stem, bench))
        records.append({"model": stem, **bench.to_dict()})
        print(f"{stem:14s} forgekit {bench.forgekit.median_ms:8.2f} ms   onnxruntime {bench.onnxruntime.median_ms:8.2f} ms"
              f"   ratio {bench.ratio:5.2f}x   compile {compile_s:5.1f} s   match {bench.outputs_match}", flush=True)
        for label, timing in bench.peers.items():
            print(f"{'':14s} {label:14s} {timing.median_ms:8.2f} ms   forgekit / {label} {bench.peer_ratio(label):5.2f}x"
                  f"   its outputs match onnxruntime: {bench.peer_info[label]['outputs_match']}", flush=True)
    table = markdown_table(rows)
    peer_rows = [f"| {stem} | {label} ({b.peer_info[label]['precision']}) | {t.median_ms:.2f} | "
                 f"{b.forgekit.median_ms:.2f} | {b.peer_ratio(label):.2f}x | {b.peer_info[label]['max_abs_error']:.1e} |"
                 for stem, b in rows for label, t in b.peers.items()]
    if peer_rows:
        table += ("\n| model | peer | peer ms | forgekit ms | forgekit / peer | peer max abs err vs ORT |\n"
                  "|---|---|---|---|---|---|\n" + "\n".join(peer_rows) + "\n")
    print()
    print(table)
    print(f"loadavg at end: {os.getloadavg()}")
    (out / "results.json").write_text(json.dumps(records, indent=2) + "\n")
    (out / "results.md").write_text(table)


if __name__ == "__main__":
    main()
