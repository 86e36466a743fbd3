"""Robustness sweep: compile every onnx-wheel `light_*` model with cpu_sched, compare with
onnxruntime (1 thread each), report time ratio and rules used.  Weights are the original
ConstantOfShape(0.02) ones, so the numeric check is weak; this is a does-it-compile-and-run test.

    /work/main/.venv/bin/python check_more_models.py
"""
import collections
import glob
import os
import sys
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_sched  # noqa: E402
from bench import expose_logits, make_inputs  # noqa: E402
from cpu_sched.registry import STATS  # noqa: E402

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 1})
light = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light")
for path in sorted(glob.glob(os.path.join(light, "light_*.onnx"))):
    name = os.path.basename(path)[6:-5]
    try:
        model = expose_logits(onnx.load(path))
        feeds = make_inputs(model, np.random.default_rng(0))
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        refs = sess.run(None, feeds)
        mod = from_onnx(model)
        order = [p.name for p in mod["main"].params]
        STATS.clear()
        t = time.time()
        ex = cpu_sched.build(mod, TARGET)
        cs = time.time() - t
        vm = relax.VirtualMachine(ex, tvm.cpu())
        args = [tvm.runtime.tensor(feeds[n]) for n in order]
        out = vm["main"](*args)
        outs = [out] if hasattr(out, "numpy") else list(out)
        ok = all(np.allclose(o.numpy(), r, rtol=1e-3, atol=1e-4 * (np.abs(r).max() or 1))
                 for o, r in zip(outs, refs))
        def tm(f, n=5):
            f()
            ts = []
            for _ in range(n):
                t0 = time.thread_time()
                f()
                ts.append(time.thread_time() - t0)
            return np.median(ts) * 1e3
        tt = tm(lambda: vm["main"](*args))
        to = tm(lambda: sess.run(None, feeds))
        print(f"{name:14s} compile {cs:5.1f}s  tvm {tt:8.2f} ms  ort {to:8.2f} ms  "
              f"ratio {tt / to:5.2f}  match={ok}  rules={dict(collections.Counter(STATS.values()))}",
              flush=True)
    except Exception as e:  # pylint: disable=broad-except
        print(f"{name:14s} FAILED: {str(e).splitlines()[-1][:200] if str(e) else type(e)}",
              flush=True)
