"""Run a ``bench/gpu_pack.py`` archive on a GPU machine without TVM: forgekit's CUDA artifacts through the
``forgekit-runtime`` wheel's Engine, checked against onnxruntime (CPU, this machine) and timed against PyTorch
eager and ``torch.compile`` on the same ONNX models (onnx2torch, same weights) in the same process.

    python bench/gpu_run.py bench/gpu_pack/pack.tar.xz --out $OUT [--deadline-s 420]

Needs Python >= 3.10 with numpy, onnxruntime and torch (CUDA); the archive brings tvm-ffi, the runtime wheel,
onnx and onnx2torch (installed with ``pip --no-deps --target`` into a scratch folder, only where missing).
Every measurement is written as it is made (``gpu_results.json`` and ``gpu_results.md`` in ``--out``), so a run
cut short by its deadline still reports what it measured: forgekit's runs first, then eager, then
``torch.compile`` (the slowest to prepare) while time is left.

Timing: CUDA events around blocks of 20 calls, each call followed by a device synchronize (latency, as an
application sees it), median over 5 blocks after 10 warm-up calls.  fp32 peers run with TF32 off (exact
fp32, like forgekit's), fp16 peers with the model and its float inputs in half precision.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

import numpy as np

WARMUP, BLOCKS, PER_BLOCK = 10, 5, 20
#: the PyTorch peers, in the order they run: (report field, torch.compile mode; None: eager).  "reduce-overhead"
#: is torch.compile with CUDA graphs: the peer of forgekit's ``+graphs`` rows
PEERS = (("eager", None), ("compile", "default"), ("compile_graphs", "reduce-overhead"))


def install(wheels: Path, site: Path, newer: Path | None = None) -> None:
    """The archive's wheels into ``site`` (no dependencies: the machine has numpy, torch, onnxruntime); then
    ``newer`` (a folder of wheels carried beside the archive: a rebuilt forgekit-runtime) over them."""
    wanted = ["forgekit_runtime"]
    for module, prefix in (("tvm_ffi", "apache_tvm_ffi"), ("onnx", "onnx-"), ("onnx2torch", "onnx2torch")):
        try:
            __import__(module)
        except ImportError:
            wanted.append(prefix)
    files = [str(w) for w in sorted(wheels.glob("*.whl")) if any(w.name.startswith(p) for p in wanted)]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    *files], check=True)
    if newer is not None and any(newer.glob("*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade",
                        "--target", str(site), *map(str, newer.glob("*.whl"))], check=True)
    sys.path.insert(0, str(site))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / denom) if denom else float(np.array_equal(a, b))


def compare(outputs: list[np.ndarray], reference: list[np.ndarray], precision: str) -> dict:
    """fp32: every element within rtol 1e-3 (atol 1e-4 of the output's scale); fp16: cosine >= 0.999."""
    cos = [cosine(o, r) for o, r in zip(outputs, reference)]
    err = [float(np.max(np.abs(o.astype(np.float64) - r))) if o.size else 0.0 for o, r in zip(outputs, reference)]
    if precision == "fp32":
        ok = all(np.allclose(o, r, rtol=1e-3, atol=1e-4 * max(1.0, float(np.max(np.abs(r))) if r.size else 1.0))
                 for o, r in zip(outputs, reference))
    else:
        ok = min(cos) >= 0.999
    return {"ok": bool(ok) and len(outputs) == len(reference), "cosine": min(cos), "max_err": max(err)}


def gpu_ms(torch, call) -> float:
    """Median ms per call (each followed by a synchronize) over blocks timed with CUDA events (without torch
    or a GPU, a dry run of the pack: perf_counter)."""
    for _ in range(WARMUP):
        call()
    if torch is None:
        blocks = []
        for _ in range(BLOCKS):
            start = time.perf_counter()
            for _ in range(PER_BLOCK):
                call()
            blocks.append((time.perf_counter() - start) * 1e3 / PER_BLOCK)
        return float(np.median(blocks))
    torch.cuda.synchronize()
    times = []
    for _ in range(BLOCKS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(PER_BLOCK):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / PER_BLOCK)
    return float(np.median(times))


def top_kernels(torch, call, n: int = 4) -> str:
    """The ``n`` kernels with the most GPU time over 10 calls (torch.profiler), as ``name µs/call (share)``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            call()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if getattr(e, "device_time_total", 0) > 0]
    total = sum(e.device_time_total for e in events) or 1.0
    events.sort(key=lambda e: -e.device_time_total)
    return "; ".join(f"{e.key[:60]} {e.device_time_total / 10:.0f}us ({e.device_time_total / total:.0%})"
                     for e in events[:n])


class Report:
    def __init__(self, out: Path, header: dict) -> None:
        self.out, self.header, self.rows = out, header, {}

    def set(self, key: tuple, **values) -> None:
        self.rows.setdefault(key, {"model": key[0], "batch": key[1], "precision": key[2]}).update(values)
        self.write()

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        rows = list(self.rows.values())
        (self.out / "gpu_results.json").write_text(json.dumps({**self.header, "rows": rows}, indent=1))
        lines = [f"# forgekit CUDA artifacts on {self.header.get('gpu')} ({self.header.get('when')})", "",
                 "| model | batch | precision | matches onnxruntime | cosine | max err | forgekit ms | eager ms | "
                 "torch.compile ms | compile+graphs ms | / eager | / compile | / compile+graphs | TFLOP/s |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            peers = self.rows.get((r["model"], r["batch"], r["precision"].split("+")[0]), r)
            f, e = r.get("forgekit_ms"), peers.get("eager_ms")
            c, g = peers.get("compile_ms"), peers.get("compile_graphs_ms")
            ratio = lambda a, b: f"{a / b:.2f}" if a and b else "–"  # noqa: E731
            fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else (str(v) if v is not None else "–")  # noqa: E731
            lines.append(f"| {r['model']} | {r['batch']} | {r['precision']} | {r.get('ok', r.get('error', '–'))} | "
                         f"{_num(r.get('cosine'), '.6f')} | {_num(r.get('max_err'), '.2e')} | {fmt(f)} | {fmt(e)} | "
                         f"{fmt(c)} | {fmt(g)} | {ratio(f, e)} | {ratio(f, c)} | {ratio(f, g)} | "
                         f"{fmt(r.get('tflops'))} |")
        errors = [f"- {r['model']} b{r['batch']} {r['precision']}: {k}: {v}" for r in rows for k, v in r.items()
                  if k.endswith("error")]
        (self.out / "gpu_results.md").write_text("\n".join(lines + [""] + errors) + "\n")


def _num(value, spec: str) -> str:
    return format(value, spec) if isinstance(value, float) else "–"


def folded(onnx_path: Path) -> Path:
    """``onnx_path`` with its shape computations folded to constants by onnxruntime's basic (standard-ONNX)
    optimizations: onnx2torch turns a Shape->Gather->Concat->Reshape into a data-dependent reshape that dynamo
    refused (BERT-style, YOLO: the torch.compile cells were empty); with constant shapes it compiles."""
    import onnxruntime as ort

    out = onnx_path.with_suffix(".folded.onnx")
    if not out.exists():
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(out)
        ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    return out


def torch_peer(torch, onnx2torch_convert, onnx_path: Path, feeds: dict, precision: str, mode: str | None):
    """A timed call of the ONNX model converted to PyTorch, eager or ``torch.compile(mode=mode)``; a compile that
    fails on the model as exported is tried once more on its shape-folded form (:func:`folded`)."""
    try:
        return _torch_peer(torch, onnx2torch_convert, onnx_path, feeds, precision, mode)
    except Exception:  # noqa: BLE001
        if not mode:
            raise
        torch._dynamo.reset()
        return _torch_peer(torch, onnx2torch_convert, folded(onnx_path), feeds, precision, mode)


def _torch_peer(torch, onnx2torch_convert, onnx_path: Path, feeds: dict, precision: str, mode: str | None):
    import contextlib

    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(onnx_path))
    try:  # shapes as Python ints (gpu_peers.py): what lets torch.compile take bert_style and PP-OCR det whole
        from gpu_peers import torch_module

        model = torch_module(torch, onnx2torch_convert, proto, device="cuda").cuda().eval()
    except Exception as exc:  # noqa: BLE001 - onnx2torch's module as it converts, as before gpu_peers.py
        print(f"gpu_peers.torch_module failed on {onnx_path.name} ({exc}); plain onnx2torch", flush=True)
        # onnx2torch reads weights from initializers only: Paddle exports (PP-OCR) hold them in Constant nodes
        for node in [n for n in proto.graph.node if n.op_type == "Constant" and n.attribute[0].name == "value"]:
            proto.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(node.attribute[0].t),
                                                                   node.output[0]))
            proto.graph.node.remove(node)
        model = onnx2torch_convert(proto).cuda().eval()
    args = [torch.from_numpy(v).cuda() for v in feeds.values()]
    scope = contextlib.nullcontext
    if precision == "fp16":  # the model in half precision; autocast where its graph mixes in fp32 constants
        half, half_args = model.half(), [a.half() if a.is_floating_point() else a for a in args]
        try:
            with torch.inference_mode():
                half(*half_args)
            model, args = half, half_args
        except RuntimeError:
            model = model.float()
            scope = lambda: torch.autocast("cuda", dtype=torch.float16)  # noqa: E731
    if mode:
        model = torch.compile(model, mode=mode)
    with torch.inference_mode(), scope():
        for _ in range(3 if mode == "reduce-overhead" else 1):  # its graphs are recorded at the 2nd or 3rd call
            model(*args)  # conversion / compilation happens here, untimed
    torch.cuda.synchronize()

    def call():
        with torch.inference_mode(), scope():
            model(*args)
        torch.cuda.synchronize()

    return call


def measure_graphs(eager, run: dict, feeds: dict, reference: list[np.ndarray], report: Report, torch) -> None:
    """The same artifact through ``Engine(cuda_graphs=True)`` (row ``<precision>+graphs``): the replayed outputs
    against onnxruntime, a replay on other input values against the engine without graphs (the graph reads its
    inputs anew), then its time."""
    from forgekit.runtime import Engine

    key = (run["model"], run["batch"], run["precision"] + "+graphs")
    try:
        engine = Engine(eager.path, cuda_graphs=True)
        for _ in range(3):  # warm-up, capture (+ launch), replay
            outputs = engine.infer(feeds)
        graphs = engine.cuda_graphs
        report.set(key, captured=graphs.captured, declined="; ".join(graphs.declined.values()) or None,
                   **compare(outputs, reference, run["precision"].split("+")[0]))
        scaled = {k: (v * 0.5).astype(v.dtype) if v.dtype.kind == "f" else v for k, v in feeds.items()}
        again = compare(engine.infer(scaled), eager.infer(scaled), "fp32")
        report.set(key, new_inputs_ok=again["ok"], new_inputs_err=again["max_err"])
        ms = gpu_ms(torch, engine.prepared_call(feeds))
        report.set(key, forgekit_ms=ms, **({"tflops": round(run["gflop"] / ms, 2)} if run.get("gflop") else {}))
    except Exception as exc:  # noqa: BLE001
        report.set(key, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")
        traceback.print_exc()


def run_feeds(work: Path, run: dict) -> dict:
    """A run's batch-1 inputs, repeated to its batch (gpu_pack.py carries batch 1 only)."""
    with np.load(work / run["feeds"]) as data:
        return {k: np.ascontiguousarray(np.repeat(data[k], run.get("repeat", 1), axis=0)) for k in data.files}


def compile_order(runs: list[dict]) -> list[dict]:
    """The order torch.compile peers are made in (here and by gpu_compile_cache.py): the largest batches first,
    whose compile cells were the ones a deadline left empty."""
    return sorted(runs, key=lambda r: -r["batch"])


def start_cache_warmer(work: Path, models: list[str] | None) -> subprocess.Popen | None:
    """``gpu_compile_cache.py`` on the upper half of the cores, this process on the lower half (None: too few
    cores to split, or no affinity control)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 8:
        return None
    mine, theirs = set(cores[: len(cores) // 2]), set(cores[len(cores) // 2:])
    warmer = subprocess.Popen([sys.executable, str(Path(__file__).with_name("gpu_compile_cache.py")), "--work",
                               str(work), *(["--models", *models] if models else [])],
                              preexec_fn=lambda: os.sched_setaffinity(0, theirs))
    os.sched_setaffinity(0, mine)
    return warmer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/results")))
    parser.add_argument("--work", type=Path, default=Path("/tmp/forgekit_gpu"))
    parser.add_argument("--deadline-s", type=float, default=420.0)
    parser.add_argument("--wheels", type=Path, help="a folder of wheels installed over the archive's")
    parser.add_argument("--models", nargs="*", help="only these models of the archive")
    parser.add_argument("--source", type=Path, help="a checkout whose forgekit/*.py replace the runtime wheel's")
    parser.add_argument("--no-graphs", dest="graphs", action="store_false",
                        help="skip the Engine(cuda_graphs=True) row of each artifact")
    parser.add_argument("--no-warm-compile", dest="warm_compile", action="store_false",
                        help="no background process compiling the torch.compile peers ahead (gpu_compile_cache.py)")
    args = parser.parse_args(argv)
    begin = time.monotonic()
    left = lambda: args.deadline_s - (time.monotonic() - begin)  # noqa: E731
    with tarfile.open(args.archive) as tar:
        tar.extractall(args.work, filter="data")
    install(args.work / "wheels", args.work / "site", args.wheels)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_pack import hydrate

    hydrate(args.work / "models")  # the larger batches' ONNX files get their shared weights back
    if args.source is not None:  # this checkout's runtime modules over the wheel's (a fix made after packing)
        import shutil

        for module in (args.work / "site").glob("forgekit/**/*.py"):
            mine = args.source / module.relative_to(args.work / "site")
            if mine.is_file():
                shutil.copyfile(mine, module)
    import onnxruntime as ort

    try:
        import torch

        assert torch.cuda.is_available()
    except (ImportError, AssertionError):  # a dry run of a CPU pack (gpu_pack.py --target host)
        torch = None
    from forgekit.runtime import Engine

    manifest = json.loads((args.work / "manifest.json").read_text())
    if args.models:
        manifest["runs"] = [r for r in manifest["runs"] if r["model"] in args.models]
    report = Report(args.out, {"gpu": torch.cuda.get_device_name(0) if torch else "no GPU (dry run)",
                               "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "torch": torch.__version__ if torch else None, "onnxruntime": ort.__version__,
                               "target": manifest["target"],
                               "timing": f"CUDA events, median of {BLOCKS}x{PER_BLOCK} synchronized calls"})
    if torch is not None:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 peers exact, as forgekit's fp32 is
        torch.backends.cudnn.allow_tf32 = False
    warmer = start_cache_warmer(args.work, args.models) if torch is not None and args.warm_compile else None
    references: dict[str, list[np.ndarray]] = {}
    seen_plans: set[str] = set()

    def feeds_of(run: dict) -> dict:
        return run_feeds(args.work, run)

    for run in manifest["runs"]:  # 1. forgekit: correctness and time (what issue 36 needs)
        key = (run["model"], run["batch"], run["precision"])
        try:
            feeds = feeds_of(run)
            if run["onnx"] not in references:
                options = ort.SessionOptions()
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the exact graph
                session = ort.InferenceSession(str(args.work / run["onnx"]), options, providers=["CPUExecutionProvider"])
                references[run["onnx"]] = session.run(None, feeds)
            engine = Engine(args.work / run["artifact"])
            outputs = engine.infer(feeds)
            report.set(key, device=str(engine.device), compile_s=run["compile_s"],
                       **compare(outputs, references[run["onnx"]], run["precision"].split("+")[0]))
            call = engine.prepared_call(feeds)
            ms = gpu_ms(torch, call)
            report.set(key, forgekit_ms=ms)
            if run.get("gflop"):  # the model's conv/matmul work at this batch, per second (H200 dense peak: fp32 67
                # TFLOP/s without tensor cores, fp16 989 with: NVIDIA's H200 datasheet)
                report.set(key, tflops=round(run["gflop"] / ms, 2))
            if torch is not None and run["batch"] > 1 and left() > 120:
                report.set(key, top_kernels=top_kernels(torch, call))
            # which algorithm cudnnFind chose per convolution, and what it measured (the extension keeps its plans
            # for the process: the lines this artifact added)
            if engine._module.implements_function("forgekit_cudnn_plans", True):
                plans = engine._module.get_function("forgekit_cudnn_plans", True)()
                lines = [line for line in str(plans).splitlines() if line not in seen_plans]
                seen_plans.update(lines)
                report.set(key, cudnn_plans=lines)
            del call
            if args.graphs:
                measure_graphs(engine, run, feeds, references[run["onnx"]], report, torch)
            del engine
        except Exception as exc:  # noqa: BLE001 - recorded, the next run goes on
            report.set(key, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")
            traceback.print_exc()
    try:
        if torch is None:
            raise ImportError("no torch with CUDA here")
        from onnx2torch import convert
    except Exception as exc:  # noqa: BLE001
        print(f"no PyTorch peers: {exc}")
        print((args.out / "gpu_results.md").read_text())
        return 0
    # a variant of forgekit's build (fp16+nhwc, +graphs) has the same peers as its base row
    base = [run for run in manifest["runs"] if "+" not in run["precision"]]
    for field, mode in PEERS:  # 2. eager, 3. torch.compile, 4. its CUDA graphs, while time is left
        for run in compile_order(base) if mode else base:
            key = (run["model"], run["batch"], run["precision"])
            if left() < (45 if mode else 20):
                report.set(key, **{f"{field}_error": "skipped: deadline"})
                continue
            try:
                call = torch_peer(torch, convert, args.work / run["onnx"], feeds_of(run), run["precision"], mode)
                report.set(key, **{f"{field}_ms": gpu_ms(torch, call)})
            except Exception as exc:  # noqa: BLE001
                report.set(key, **{f"{field}_error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"})
            torch.cuda.empty_cache()
    if warmer is not None:
        warmer.kill()
    print((args.out / "gpu_results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
