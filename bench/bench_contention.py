"""forgekit vs onnxruntime under CPU contention: busy-loop background processes on the cores, both runtimes
timed in the same conditions, interleaved, repeated.

    .venv/bin/python bench/bench_contention.py [--loads 0,1,2] [--reps 5] [--runs 150] [--threads 2]
                                               [--variants default,bound] [--work /tmp/forgekit-contention]

A ResNet-style classifier (ResNet-18's blocks on a 1x3x128x128 input, ~6 ms on an idle 2-core machine) is
built in code and compiled once for this CPU.  For each repetition and each load level (N processes spinning
``while True: pass``) every runtime runs in a fresh worker process of its own, one after the other under the
same load: forgekit's ``Engine`` with the environment ``ensure_runtime`` establishes ("forgekit"), forgekit
as it ran before issue 39 (TVM's thread binding, a fixed pool size: "forgekit-before"),
onnxruntime, and each of them twice in one process (two engines/sessions called concurrently from two threads,
a pipeline competing with itself: "x2").  Each prints median and p99 latency (ms) per repetition and the ratio
to onnxruntime's under the same load, then the worst ratio over the repetitions.

This shared machine is never idle: other jobs add to the load levels, so compare the ratios measured side by
side, not absolute numbers between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
INPUT = [1, 3, 128, 128]


# ----------------------------------------------------------------------------- model
def resnet_style():
    """ResNet-18's stem and 8 basic blocks (64-512 channels) on a 128x128 image: ~0.6 GFLOP."""
    from forgekit.testing.zoo_cnn import Net, resnet18_features

    net = Net(39)
    x = resnet18_features(net)
    net.head(x, 512)
    return net.finish("resnet_style", {"input": INPUT}, {"logits": [1, 1000]})


def prepare(work: Path) -> tuple[Path, Path]:
    import onnx

    work.mkdir(parents=True, exist_ok=True)
    model, artifact = work / "resnet_style.onnx", work / "artifact"
    if not model.exists():
        onnx.save(resnet_style(), model)
    if not (artifact / "metadata.json").exists():
        t = time.time()
        subprocess.run([sys.executable, "-m", "forgekit", "compile", str(model), "-o", str(artifact), "-t", "host",
                        "-f"], check=True, stdout=subprocess.DEVNULL)
        print(f"compiled {model.name} for this CPU in {time.time() - t:.0f} s", flush=True)
    return model, artifact


# ----------------------------------------------------------------------------- background load
def start_load(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


# ----------------------------------------------------------------------------- worker (one runtime, one process)
def worker(runtime: str, path: str, threads: int, runs: int, copies: int) -> None:
    import numpy as np

    x = np.random.default_rng(0).standard_normal(INPUT).astype(np.float32)
    if runtime == "onnxruntime":
        import onnxruntime as ort

        def make():
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            return lambda: sess.run(None, {"input": x})
    else:
        from forgekit.runtime import Engine

        def make():
            engine = Engine(path)
            return lambda: engine.infer(x)

    calls = [make() for _ in range(copies)]
    times: list[list[float]] = [[] for _ in calls]

    def loop(i: int) -> None:
        call = calls[i]
        for _ in range(5):
            call()
        for _ in range(runs):
            t = time.perf_counter()
            call()
            times[i].append((time.perf_counter() - t) * 1e3)

    if copies == 1:
        loop(0)
    else:
        pool = [threading.Thread(target=loop, args=(i,)) for i in range(copies)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    flat = sorted(v for ts in times for v in ts)
    p99 = flat[min(len(flat) - 1, int(round(0.99 * (len(flat) - 1))))]
    print(json.dumps({"median": statistics.median(flat), "p99": p99,
                      "affinity": sorted(os.sched_getaffinity(0))}))


VARIANTS = {
    # name: (runtime, extra environment)
    "forgekit": ("forgekit", {}),
    # what forgekit did before issue 39: TVM's thread binding, the pool's size fixed
    "forgekit-before": ("forgekit", {"TVM_BIND_THREADS": "1", "FORGEKIT_ADAPTIVE_THREADS": "0"}),
    # one half of the fix each
    "forgekit-unbound": ("forgekit", {"TVM_BIND_THREADS": "0", "FORGEKIT_ADAPTIVE_THREADS": "0"}),
    "forgekit-bound-adaptive": ("forgekit", {"TVM_BIND_THREADS": "1"}),
    "forgekit-1thread": ("forgekit", {"TVM_NUM_THREADS": "1", "FORGEKIT_ADAPTIVE_THREADS": "0"}),
    "onnxruntime": ("onnxruntime", {}),
}


def measure(name: str, copies: int, model: Path, artifact: Path, args: argparse.Namespace) -> dict:
    runtime, extra = VARIANTS[name]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TVM_", "FORGEKIT_ADAPTIVE"))}
    if runtime == "forgekit":
        env["TVM_NUM_THREADS"] = str(args.threads)
    env.update(extra, PYTHONPATH=str(ROOT))
    path = artifact if runtime == "forgekit" else model
    out = subprocess.run([sys.executable, __file__, "--worker", runtime, str(path), str(args.threads), str(args.runs),
                          str(copies)], env=env, check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loads", default="0,1,2", help="busy background processes, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--runs", type=int, default=150, help="timed inferences per worker (per engine with x2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default="forgekit,forgekit-before,onnxruntime", help=", ".join(VARIANTS))
    ap.add_argument("--copies", default="1,2", help="engines per process (2: called from two threads at once)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/forgekit-contention"))
    ap.add_argument("--json", type=Path, help="also write every measurement here")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        runtime, path, threads, runs, copies = args.worker
        worker(runtime, path, int(threads), int(runs), int(copies))
        return

    model, artifact = prepare(args.work)
    loads = [int(v) for v in args.loads.split(",")]
    variants = args.variants.split(",")
    copies_list = [int(c) for c in args.copies.split(",")]
    results: dict[tuple[int, int, str], list[dict]] = {}
    for rep in range(args.reps):
        for load in loads:
            procs = start_load(load)
            try:
                time.sleep(0.5)
                for copies in copies_list:
                    # the order rotates per repetition: no runtime always runs first after the load starts
                    order = variants[rep % len(variants):] + variants[:rep % len(variants)]
                    for name in order:
                        results.setdefault((load, copies, name), []).append(measure(name, copies, model, artifact, args))
            finally:
                stop_load(procs)
            print(f"rep {rep + 1}/{args.reps} load {load} done", file=sys.stderr, flush=True)

    print(f"\n{os.cpu_count()} CPUs, {args.threads} threads, {args.runs} runs per worker, {args.reps} repetitions; "
          "latency ms, median / p99 per repetition; ratio = runtime / onnxruntime under the same load and rep\n")
    head = f"{'load':>4}  {'engines':>7}  {'runtime':<15} " + "  ".join(f"{'rep ' + str(r + 1):>13}" for r in range(args.reps))
    print(head + "   worst ratio med/p99")
    for load in loads:
        for copies in copies_list:
            ref = results[(load, copies, "onnxruntime")] if "onnxruntime" in variants else None
            for name in variants:
                rs = results[(load, copies, name)]
                cells = "  ".join(f"{r['median']:6.1f}/{r['p99']:6.1f}" for r in rs)
                worst = ""
                if ref is not None and name != "onnxruntime":
                    med = max(r["median"] / o["median"] for r, o in zip(rs, ref))
                    p99 = max(r["p99"] / o["p99"] for r, o in zip(rs, ref))
                    worst = f"   {med:5.2f}x / {p99:5.2f}x"
                print(f"{load:>4}  {copies:>7}  {name:<15} {cells}{worst}")
    if args.json:
        args.json.write_text(json.dumps([{"load": k[0], "copies": k[1], "runtime": k[2], "runs": v}
                                         for k, v in results.items()], indent=1))


if __name__ == "__main__":
    main()
