"""Benchmark cpu_sched-compiled TVM vs onnxruntime (same process, both at 2 threads).

    TVM_NUM_THREADS=2 /work/main/.venv/bin/python bench.py [model ...] [--runs N] [--baseline]

--baseline also compiles with the stock relax.get_default_pipeline (slow, for comparison).
"""
import argparse
import os
import sys
import time

THREADS = 2
for _i, _a in enumerate(sys.argv):
    if _a == "--threads":
        THREADS = int(sys.argv[_i + 1])
os.environ["TVM_NUM_THREADS"] = str(THREADS)  # must be set before the TVM runtime starts
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu_sched  # noqa: E402

MODELS = ["resnet50", "squeezenet", "resnet18", "mobilenetv2", "bert4l"]
TARGET = {"kind": "llvm", "mcpu": os.environ.get("BENCH_MCPU", "znver4"), "num-cores": THREADS}


def make_inputs(model, rng):
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in tt.shape.dim]
        if tt.elem_type == onnx.TensorProto.INT64:
            if "mask" in i.name:
                feeds[i.name] = np.ones(shape, "int64")
            else:
                feeds[i.name] = rng.integers(0, 8000, shape).astype("int64")
        else:
            feeds[i.name] = rng.standard_normal(shape).astype("float32")
    return feeds


def median_ms(fn, runs, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ts))


def run_tvm(ex, feeds, order):
    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(feeds[n], dev) for n in order]
    fn = lambda: vm["main"](*args)  # noqa: E731
    out = fn()
    outs = [out] if hasattr(out, "numpy") else list(out)
    return [o.numpy() for o in outs], fn


CLOCK = time.perf_counter


def interleaved_ms(fa, fb, runs, warmup=3, block=5, settle_s=0.05):
    """Median ms of fa and fb, timed in alternating blocks of `block` runs so machine-load swings
    hit both about equally.  Between blocks we sleep `settle_s`: both runtimes' worker threads
    spin-wait for a while after a call returns, and a spinning ORT worker steals a core from TVM's
    next call (and vice versa) if the two are timed back to back.
    With --cpu-time (only meaningful with --threads 1) the clock is the calling thread's CPU
    time, which does not count time the thread was preempted by other processes."""
    time_fn = CLOCK
    for _ in range(warmup):
        fa()
        fb()
    ta, tb = [], []
    while len(ta) < runs:
        for f, acc in ((fa, ta), (fb, tb)):
            time.sleep(settle_s)
            for _ in range(min(block, runs - len(acc))):
                t = time_fn()
                f()
                acc.append((time_fn() - t) * 1e3)
    interleaved_ms.mins = (float(np.min(ta)), float(np.min(tb)))
    return float(np.median(ta)), float(np.median(tb))


def expose_logits(model):
    """If the graph ends in Softmax, also output its input: a saturated softmax (ResNet-50 with
    random weights is one-hot) would make the correctness check meaningless."""
    last = model.graph.node[-1]
    if last.op_type == "Softmax" and len(model.graph.output) == 1:
        model.graph.output.append(onnx.helper.make_tensor_value_info(
            last.input[0], onnx.TensorProto.FLOAT, None))
    return model


def bench_model(name, runs, baseline=False):
    path = os.path.join(HERE, "models", f"{name}.onnx")
    model = expose_logits(onnx.load(path))
    rng = np.random.default_rng(0)
    feeds = make_inputs(model, rng)
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    refs = sess.run(None, feeds)

    target = tvm.target.Target(TARGET)
    mod = from_onnx(model)
    order = [p.name for p in mod["main"].params]
    t = time.time()
    ex = cpu_sched.build(mod, target, pack_weights=os.environ.get("CPU_SCHED_PACK", "1") == "1")
    compile_s = time.time() - t
    outs, fn = run_tvm(ex, feeds, order)
    ort_ms, tvm_ms = interleaved_ms(lambda: sess.run(None, feeds), fn, runs)
    ok, err, scale = True, 0.0, 0.0
    for out, ref in zip(outs, refs):  # every output (final + exposed logits)
        sc = float(np.abs(ref).max()) or 1.0
        e = float(np.abs(out - ref).max())
        ok &= bool(np.allclose(out, ref, rtol=1e-3, atol=1e-4 * sc))
        if e / sc >= err / (scale or 1.0):
            err, scale = e, sc
    ort_min, tvm_min = interleaved_ms.mins
    row = dict(model=name, tvm_ms=tvm_ms, ort_ms=ort_ms, ratio=tvm_ms / ort_ms,
               tvm_min=tvm_min, ort_min=ort_min, ratio_min=tvm_min / ort_min,
               compile_s=compile_s, max_abs_err=err, scale=scale, match=bool(ok))
    if baseline:
        t = time.time()
        ex0 = tvm.compile(from_onnx(model), target=target,
                          relax_pipeline=relax.get_default_pipeline(target))
        row["base_compile_s"] = time.time() - t
        _, fn0 = run_tvm(ex0, feeds, order)
        row["base_ms"] = median_ms(fn0, max(3, runs // 5), warmup=1)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=MODELS)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--baseline", action="store_true")
    ap.add_argument("--threads", type=int, default=2, help="TVM and ORT intra-op threads")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with thread CPU time (use with --threads 1 on a loaded machine)")
    a = ap.parse_args()
    global CLOCK
    if a.cpu_time:
        assert THREADS == 1, "--cpu-time needs --threads 1"
        CLOCK = time.thread_time
    rows = []
    print(f"clock={'thread CPU time' if a.cpu_time else 'wall'}  threads={THREADS}  target={TARGET}  {time.strftime('%Y-%m-%d %H:%M:%S')}  "
          f"loadavg={os.getloadavg()}")
    for m in a.models:
        r = bench_model(m, a.runs, a.baseline)
        rows.append(r)
        print(r, flush=True)
    print()
    hdr = ("| model | TVM ms (median) | ORT ms (median) | TVM/ORT | TVM min | ORT min | "
           "TVM/ORT (min) | compile s | max abs err (out scale) | match |")
    if a.baseline:
        hdr += " untuned default ms |"
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for r in rows:
        line = (f"| {r['model']} | {r['tvm_ms']:.2f} | {r['ort_ms']:.2f} | {r['ratio']:.2f}x | "
                f"{r['tvm_min']:.2f} | {r['ort_min']:.2f} | {r['ratio_min']:.2f}x | "
                f"{r['compile_s']:.1f} | {r['max_abs_err']:.2e} ({r['scale']:.2g}) | {r['match']} |")
        if a.baseline:
            line += f" {r['base_ms']:.1f} |"
        print(line)
    print(f"loadavg at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
