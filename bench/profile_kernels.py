"""Per-kernel profile: time every scheduled PrimFunc of a model standalone (random inputs) and
report ms x calls, so the hottest kernels show up.  Also reports GFLOP/s of MAC kernels.

    TVM_NUM_THREADS=1 .venv/bin/python bench/profile_kernels.py resnet50 [--top 15] [--quantize]
    (after bench/make_models.py)
"""
import argparse
import collections
import os
import sys

os.environ.setdefault("TVM_NUM_THREADS", "2")
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
from forgekit.backends import cpu as cpu_sched  # noqa: E402
from forgekit.backends.cpu.registry import STATS  # noqa: E402


def _time_ms(f, args, reps=7):
    """Median ms; thread CPU time when TVM runs single-threaded (robust to machine load)."""
    import time
    clock = time.thread_time if os.environ.get("TVM_NUM_THREADS") == "1" else time.perf_counter
    f(*args)
    n = 1
    t = clock()
    f(*args)
    one = max(clock() - t, 1e-6)
    n = max(1, int(0.02 / one))
    ts = []
    for _ in range(reps):
        t = clock()
        for _ in range(n):
            f(*args)
        ts.append((clock() - t) / n * 1e3)
    return float(np.median(ts))


def scheduled_module(mod, target):
    seq = tvm.transform.Sequential(cpu_sched.fusion_passes(target, pack_weights=PACK))
    with target:
        fused = seq(mod)
        return fused, cpu_sched.ApplyRules(target)(fused)


def mac_flops(func):
    """2 * iteration-domain size of the MAC reduction block of an unscheduled PrimFunc."""
    from tvm import s_tir
    try:
        sch = s_tir.Schedule(func)
        best = 0
        for b in sch.get_child_blocks(sch.get_sblock("root")):
            blk = sch.get(b)
            if blk.init is None:
                continue
            e = 1
            for iv in blk.iter_vars:
                e *= int(iv.dom.extent)
            best = max(best, 2 * e)
        return best
    except Exception:  # pylint: disable=broad-except
        return 0


def _unused_mac_flops(func):
    """2 * prod(loop extents) of the MAC block, if any (from the unscheduled iter domains)."""
    flops = 0
    def visit(n):
        nonlocal flops
        if isinstance(n, tvm.tirx.stmt.SBlock) and n.init is not None and n.iter_vars:
            e = 1
            for iv in n.iter_vars:
                e *= int(iv.dom.extent)
            flops = max(flops, 2 * e)
    tvm.tirx.stmt_functor.post_order_visit(func.body, visit) if hasattr(tvm.tirx, "stmt_functor") else None
    return flops


PACK = os.environ.get("CPU_SCHED_PACK", "1") == "1"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--quantize", action="store_true",
                    help="profile the static per-channel int8 module (8 random calibration samples)")
    a = ap.parse_args()
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    path = os.path.join(HERE, "models", f"{a.model}.onnx")
    if a.quantize:
        import forgekit
        ir = forgekit.from_onnx(path)
        rng = np.random.default_rng(0)
        shape = [int(d) for d in ir.input_shapes[0]]
        ir.calibrate([rng.standard_normal(shape).astype(np.float32) for _ in range(8)])
        ir.quantize(per_channel=True, calib_method="percentile", quant_type="static")
        mod = ir.mod
    else:
        mod = from_onnx(onnx.load(path))
    calls = collections.Counter()
    sites = {}
    fmod, smod = scheduled_module(mod, target)

    def _visit(e):
        if (isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)
                and e.op.name == "relax.call_tir"):
            n = e.args[0].name_hint
            calls[n] += 1
            tys = [x.ty for x in e.args[1].fields] + [e.ty]
            sites[n] = [([int(d) for d in t.shape.values], str(t.dtype)) for t in tys]
    relax.analysis.post_order_visit(smod["main"], _visit)
    dev = tvm.cpu()
    rows = []
    for gv, f in smod.functions_items():
        if not isinstance(f, tvm.tirx.PrimFunc):
            continue
        name = gv.name_hint
        lib = tvm.tirx.build(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target=target)
        if name not in sites:
            continue
        args = []
        for shp, dt in sites[name]:
            args.append(tvm.runtime.tensor(np.random.uniform(-1, 1, shp).astype(dt)
                                           if "float" in dt else np.random.randint(-100, 100, shp).astype(dt), dev))
        t = _time_ms(lib["main"], args)
        fl = mac_flops(fmod[name])
        shp = "x".join(str(d) for d in sites[name][-1][0]) + " w" + "x".join(
            str(d) for d in sites[name][1][0]) if len(sites[name]) > 2 else ""
        rows.append((t * calls[name], t, calls[name], name + " " + shp, STATS.get(name, "?"),
                     fl / t / 1e6))
    rows.sort(reverse=True)
    tot = sum(r[0] for r in rows)
    print(f"total {tot:.2f} ms over {len(rows)} kernels")
    for r in rows[: a.top]:
        gf = f"{r[5]:6.1f} GFLOP/s" if r[5] else " " * 14
        print(f"{r[0]:8.3f} ms  {r[1]:7.3f} x{r[2]:<3d} {gf} {r[4]:12s} {r[3]}")


if __name__ == "__main__":
    main()
