"""Compile every model with cpu_sched for other targets (no execution): aarch64 NEON and AVX2.

    /work/main/.venv/bin/python check_targets.py
"""
import os
import sys
import time

import onnx
import tvm
from tvm.relax.frontend.onnx import from_onnx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu_sched  # noqa: E402
from cpu_sched.registry import STATS  # noqa: E402

TARGETS = {
    "neon": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"],
             "mcpu": "cortex-a76"},
    "avx2": {"kind": "llvm", "mcpu": "haswell", "num-cores": 2},
}

if __name__ == "__main__":
    names = sys.argv[1:] or ["resnet50", "squeezenet", "resnet18", "mobilenetv2", "bert4l"]
    for tname, tdict in TARGETS.items():
        tgt = tvm.target.Target(tdict)
        for m in names:
            STATS.clear()
            t = time.time()
            ex = cpu_sched.build(from_onnx(onnx.load(os.path.join(HERE, "models", f"{m}.onnx"))), tgt)
            rules = {}
            for r in STATS.values():
                rules[r] = rules.get(r, 0) + 1
            print(f"{tname:5s} {m:12s} compiled in {time.time() - t:5.1f}s  lanes="
                  f"{cpu_sched.target_info(tgt).vec_lanes}  rules={rules}", flush=True)
