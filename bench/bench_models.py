"""forgekit vs onnxruntime over a list of models: compile each for this CPU, then time both runtimes
side by side (same threads, same inputs, same run), check the outputs, and print/write the ratios.

    .venv/bin/python bench/make_models.py                  # once: writes bench/models/*.onnx
    .venv/bin/python bench/bench_models.py [MODEL ...] [--threads 2] [--runs 30] [--opt-level 3]
                                           [--tune-trials N] [--out bench/results] [--peer openvino]
                                           [--precision bf16] [--input-shape x=1x3x640x640]

MODEL is a name in bench/models/ (resnet50, squeezenet, resnet18, mobilenetv2, bert4l: the default
list), an .onnx path, or sample:NAME.  Writes ``results.json`` and ``results.md`` under ``--out``.
Each model is compiled by ``forgekit compile`` in its own process (its peak memory is the compile's), then
timed with ``forgekit.evaluate.bench`` (peak RSS of forgekit, onnxruntime and each peer in a process of its own).
Timings on shared machines drift by ±30 % between runs: compare ratios, which are measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def compile_alone(model: Path, artifact: Path, target: object, args: argparse.Namespace) -> tuple[float, float]:
    """Compile with ``forgekit compile`` in its own process: wall seconds and that process's peak memory (MB,
    ``compile_report.json``), which an in-process compile after other models could not isolate."""
    cmd = [sys.executable, "-m", "forgekit", "compile", str(model), "-o", str(artifact), "-O", str(args.opt_level),
           "-t", target if isinstance(target, str) else json.dumps(target), "--force", "--export-metadata", "-q"]
    if args.tune_trials is not None:
        cmd += ["--tune-trials", str(args.tune_trials)] + (["--records", args.records] if args.records else [])
    if args.precision:
        cmd += ["--precision", args.precision]
    import onnx

    names = {i.name for i in onnx.load(str(model), load_external_data=False).graph.input}
    for pin in args.input_shape:
        if pin.split("=", 1)[0] in names:
            cmd += ["--input-shape", pin]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    seconds = time.perf_counter() - start
    report = json.loads((artifact / "compile_report.json").read_text())
    return seconds, report["peak_rss_mb"]


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
    parser.add_argument("--precision", default=None, help="fp32|bf16|fp16 for forgekit's conv/matmul.")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS",
                        help="Pin an input of the models that have it (e.g. x=1x3x640x640). Repeatable.")
    import bench_quantize

    bench_quantize.add_arguments(parser)
    args = parser.parse_args()
    if args.quantize:
        bench_quantize.run([m for m in args.models if (HERE / "models" / f"{m}.onnx").exists() or "." in m], args)
        return

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
        artifact = out / "artifacts" / stem
        compile_s, compile_mb = compile_alone(path, artifact, target, args)
        bench = benchmark_artifact(artifact, path, runs=args.runs, threads=args.threads, peers=args.peer)
        bench.compile_seconds = round(compile_s, 2)  # import + passes + codegen + link, wall clock
        bench.extra["compile_peak_mb"] = compile_mb
        rows.append((stem, bench))
        records.append({"model": stem, **bench.to_dict()})
        print(f"{stem:14s} forgekit {bench.forgekit.median_ms:8.2f} ms   onnxruntime {bench.onnxruntime.median_ms:8.2f} ms"
              f"   ratio {bench.ratio:5.2f}x   compile {compile_s:5.1f} s, {compile_mb:.0f} MB   "
              f"match {bench.outputs_match}", flush=True)
        for label, timing in bench.peers.items():
            print(f"{'':14s} {label:14s} {timing.median_ms:8.2f} ms   forgekit / {label} {bench.peer_ratio(label):5.2f}x"
                  f"   its outputs match onnxruntime: {bench.peer_info[label]['outputs_match']}", flush=True)
    table = markdown_table(rows)
    peer_rows = [f"| {stem} | {label} ({b.peer_info[label]['precision']}) | {t.median_ms:.2f} | "
                 f"{b.forgekit.median_ms:.2f} | {b.peer_ratio(label):.2f}x | {_mb(t.peak_rss_mb)} | "
                 f"{_mb(b.forgekit.peak_rss_mb)} | {b.peer_info[label]['max_abs_error']:.1e} |"
                 for stem, b in rows for label, t in b.peers.items()]
    if peer_rows:
        table += ("\n| model | peer | peer ms | forgekit ms | forgekit / peer | peer MB | forgekit MB | "
                  "peer max abs err vs ORT |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(peer_rows) + "\n")
    table += ("\n| model | compile s | compile peak MB |\n|---|---|---|\n"
              + "\n".join(f"| {stem} | {b.compile_seconds:.1f} | {b.extra['compile_peak_mb']:.0f} |" for stem, b in rows)
              + "\n")
    print()
    print(table)
    print(f"loadavg at end: {os.getloadavg()}")
    (out / "results.json").write_text(json.dumps(records, indent=2) + "\n")
    (out / "results.md").write_text(table)


if __name__ == "__main__":
    main()
