"""ConvTranspose vs a same-size Conv (same multiply-adds), in GFLOP/s, fp32 and bf16 (issue 39, point 7).

    .venv/bin/python bench/bench_conv_transpose.py [--channels 128] [--size 28] [--rounds 7] [--stock] [--no-bf16]

Each case is a single-op model: ConvTranspose(C -> C, KxK, stride s) on a 1 x C x size x size input, and a
Conv(C -> C, KxK, stride 1, same padding) on the same input, which makes exactly as many multiply-adds
(C*C*size*size*K*K).  A stride-1 3x3 Conv runs Winograd (2.25 multiplies per output where direct takes 9), which
no phase of a strided ConvTranspose can match (stop 45's note), so strided cases also time the Conv whose
adjoint the ConvTranspose is ("adj": KxK, stride s, on the ConvTranspose's output size, down to size x size:
the same weights and multiply-adds, computed directly as any strided conv is).  GFLOP/s counts those real MACs (x2) for both, so zero taps a rewrite computes count
against it.  ``--stock`` also times the ConvTranspose with forgekit's rewrite disabled (TVM's loop nest: what
ran before).  All artifacts are compiled for ``host`` first, then timed in interleaved rounds (median of
per-round medians), same threads; this shared machine's absolute numbers drift, the ratios much less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

CASES = [  # kernel, stride, pads, output_padding: the class the rewrite covers
    (2, 1, 0, 0), (3, 1, 1, 0), (4, 1, 1, 0), (2, 2, 0, 0), (3, 2, 1, 1), (4, 2, 1, 0)]


def models(kernel: int, stride: int, pad: int, out_pad: int, c: int, size: int):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(kernel * 10 + stride)
    w = (rng.standard_normal((c, c, kernel, kernel)) / np.sqrt(c * kernel * kernel)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])

    def model(node, out_hw):
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, out_hw, out_hw])
        graph = helper.make_graph([node], "m", [x], [y], [numpy_helper.from_array(w, "w")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    attrs = {"kernel_shape": [kernel] * 2, "strides": [stride] * 2, "pads": [pad] * 4}
    if out_pad:
        attrs["output_padding"] = [out_pad] * 2
    out = (size - 1) * stride + kernel + out_pad - 2 * pad
    ct = model(helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs), out)
    before, after = (kernel - 1) // 2, kernel // 2  # same padding: size x size out, size*size*K*K taps per channel pair
    conv = model(helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[kernel] * 2,
                                  pads=[before, before, after, after]), size)
    adjoint = None
    if stride > 1:  # the conv this ConvTranspose is the transpose of: out x out -> size x size
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, out, out])
        adjoint = model(helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[kernel] * 2, strides=[stride] * 2,
                                         pads=[pad] * 4), size)
    return ct, conv, adjoint


def _compute(kernel: str) -> bool:
    """A kernel that computes the convolution (not the VM's builtins, the weights' lookup, the model's
    NCHW<->NHWC transposes or the ConvTranspose's depth-to-space shuffle, which ``ms`` includes)."""
    layout = ("transpose" in kernel or "reshape" in kernel or "strided_slice" in kernel) and "conv" not in kernel
    return not (kernel.startswith("vm.") or kernel == "forgekit_weight" or layout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--size", type=int, default=28)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=20, help="calls per round")
    parser.add_argument("--stock", action="store_true", help="also time TVM's loop nest (the rewrite disabled)")
    parser.add_argument("--no-bf16", action="store_true")
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # before the runtime library is loaded

    import numpy as np

    import forgekit
    import forgekit.passes.conv_transpose as rewrite
    from forgekit.runtime import Engine
    from forgekit.runtime.cpu import host_features
    from forgekit.evaluate.profile import profile_engine
    from forgekit.runtime.stats import time_calls

    precisions = ["fp32"] + ([] if args.no_bf16 or "avx512bf16" not in host_features() else ["bf16"])
    work = Path(tempfile.mkdtemp(prefix="forgekit-convt-"))
    engines, rows = {}, []
    x = np.random.default_rng(0).standard_normal((1, args.channels, args.size, args.size)).astype(np.float32)
    feeds = {}  # the adjoint convs read the ConvTranspose's output size
    for case in CASES:
        ct, conv, adjoint = models(*case, args.channels, args.size)
        for prec in precisions:
            opts = {"set_bfloat16": True} if prec == "bf16" else {}
            for kind, model in (("convT", ct), ("conv", conv), ("adj", adjoint)):
                if model is None:
                    continue
                key = (case, prec, kind)
                engines[key] = Engine(forgekit.from_onnx(model).compile(
                    target="host", output_path=work / "-".join(map(str, (*case, prec, kind))), **opts).path)
            if args.stock and prec == "fp32":
                keep = rewrite.conv_transpose_as_conv
                rewrite.conv_transpose_as_conv = lambda mod: mod  # bench only: what ran before the rewrite
                try:
                    engines[(case, prec, "stock")] = Engine(forgekit.from_onnx(ct).compile(
                        target="host", output_path=work / "-".join(map(str, (*case, prec, "stock")))).path)
                finally:
                    rewrite.conv_transpose_as_conv = keep
        print(f"compiled k{case[0]} s{case[1]}", file=sys.stderr, flush=True)
    times: dict = {key: [] for key in engines}
    kernels: dict = {key: [] for key in engines}  # per round: ms of the compute kernels (no layout transposes)
    for key in engines:
        if key[2] == "adj":
            k, st, pad, op = key[0]
            out = (args.size - 1) * st + k + op - 2 * pad
            feeds[key] = np.random.default_rng(1).standard_normal((1, args.channels, out, out)).astype(np.float32)
    for _ in range(args.rounds):
        for key, engine in engines.items():
            xi = feeds.get(key, x)
            times[key].append(statistics.median(time_calls(lambda: engine.infer(xi), args.runs, warmup=2)))
            kernels[key].append(sum(r.ms for r in profile_engine(engine, [xi], runs=args.runs) if _compute(r.name)))
    macs = {case: args.channels ** 2 * args.size ** 2 * case[0] ** 2 for case in CASES}
    print(f"C={args.channels} in={args.size}x{args.size} batch 1, {args.threads} threads, median of {args.rounds} "
          f"interleaved rounds x {args.runs} calls; GFLOP/s = 2*MACs/time, 'kern': the conv kernels alone "
          "(profiled), 'all': the whole single-op model (NCHW<->NHWC transposes, convT's shuffle)")
    head = (f"{'k':>2} {'s':>2} {'pad':>3} {'opad':>4} {'prec':>4} {'MMAC':>6} {'convT ms':>8} {'conv ms':>8} "
            f"{'convT kern':>10} {'conv kern':>9} {'ratio':>5} {'convT all':>9} {'conv all':>8} {'ratio':>5}")
    print(head + f" {'adj kern':>8} {'ratio':>5}" + (f" {'stock ms':>8} {'stock GF/s':>10}" if args.stock else ""))
    for case in CASES:
        for prec in precisions:
            t = {kind: statistics.median(times[(case, prec, kind)]) for kind in ("convT", "conv")}
            kt = {kind: statistics.median(kernels[(case, prec, kind)]) for kind in ("convT", "conv")}
            gf = {kind: 2 * macs[case] / (t[kind] * 1e-3) / 1e9 for kind in t}
            kg = {kind: 2 * macs[case] / (kt[kind] * 1e-3) / 1e9 for kind in kt}
            line = (f"{case[0]:>2} {case[1]:>2} {case[2]:>3} {case[3]:>4} {prec:>4} {macs[case] / 1e6:>6.1f} "
                    f"{t['convT']:>8.3f} {t['conv']:>8.3f} {kg['convT']:>10.1f} {kg['conv']:>9.1f} "
                    f"{kg['conv'] / kg['convT']:>5.2f} {gf['convT']:>9.1f} {gf['conv']:>8.1f} {gf['conv'] / gf['convT']:>5.2f}")
            if (case, prec, "adj") in kernels:
                ka = 2 * macs[case] / (statistics.median(kernels[(case, prec, "adj")]) * 1e-3) / 1e9
                line += f" {ka:>8.1f} {ka / kg['convT']:>5.2f}"
            else:
                line += f" {'-':>8} {'-':>5}"
            if (case, prec, "stock") in times:
                ts = statistics.median(times[(case, prec, "stock")])
                line += f" {ts:>8.3f} {2 * macs[case] / (ts * 1e-3) / 1e9:>10.1f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
