"""Differential fuzzing against onnxruntime (forgekit.testing): generator, harness, shrinker, regressions.

* fast, no TVM: the generator is deterministic and every generated graph is valid ONNX that
  onnxruntime runs (a few hundred seeds), the shrinker minimizes, the comparison and the message
  normalization behave;
* a smoke slice of generated graphs compiled at every opt level, then every regression asset in
  ``tests/assets/fuzz/`` at every level;
* ``slow``: a fixed slice of 250 graphs, two opt levels each (every level in 40 % of them), every tenth
  one also quantized to int8; all compiled for ``host`` (this CPU), as users compile.

A failure class listed in :data:`KNOWN_FAILURES` is tolerated (an asset listed by file name is an
expected failure, strict: once the bug is fixed the test says so and the entry must go).  Reproduce
one seed with ``python bench/fuzz_onnx.py --seeds 123 --out /tmp/fz``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from forgekit.testing import feeds_for, generate  # noqa: E402
from forgekit.testing.differential import Result, Worker, check, compare, normalize, reference  # noqa: E402
from forgekit.testing.graph import ENVS  # noqa: E402
from forgekit.testing.shrink import shrink  # noqa: E402

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "fuzz"
LEVELS = (0, 1, 2, 3, 4)

#: failure class (or regression asset file name) -> the issue behind it.  Shrink this as bugs get fixed.
#: Empty: every asset in tests/assets/fuzz/ passes at every level (their README says what each one caught and
#: which module fixes it); a new class found by a campaign goes here with its asset until it is fixed.
KNOWN_FAILURES: dict[str, str] = {
    # Loud, not wrong: x[..., -5:] on a symbolic length W has min(5, W) elements, which a LayerNorm over 5
    # cannot be proven to match; TVM stops at VM codegen and forgekit says to pin the input (--input-shape).
    "slice_last5_symbolic_layernorm_unresolved.onnx": "compile error with a hint to pin the dynamic input: "
                                                      "min(5, W) cannot be proven equal to 5",
    # Wrong by 2.2e-4 of the output's scale at levels 2-3: a LayerNorm over a constant row (all 0.65) must give
    # beta exactly; the fp32 sum of 336 equal values rounds, and sqrt(epsilon = 1e-3) magnifies x - mean (seed 4214)
    "layernorm_constant_row_o2.onnx": "a constant row's mean rounds in the fp32 sum: not fixed (stop 59's note)",
    **{f"compile-error:L{lv}:TVM failed to compile: CodeGenVM cannot emit this Relax operator directly. Run the "
       "appropriate lowering pass, or route ...": "see slice_last5_symbolic_layernorm_unresolved.onnx"
       for lv in range(5)},
}


#: op types the generator must produce within the validity slice
REQUIRED_OPS = {
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Relu", "LeakyRelu",
    "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Selu", "Softplus", "Exp", "Log", "Sqrt", "Abs", "Neg",
    "Clip", "Erf", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Concat", "Split", "Pad",
    "Resize", "MaxPool", "AveragePool", "GlobalAveragePool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
    "Softmax", "LogSoftmax", "LayerNormalization", "BatchNormalization", "Cast", "Where", "Greater", "Less", "Equal",
    "Shape", "Gather",
}


def _unknown(seed: int, result: Result) -> list[str]:
    return [f"{seed}: {f.cls} (level {f.level}, max error {f.max_error}) -- {result.description}"
            for f in result.bugs if f.cls not in KNOWN_FAILURES]


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


# ---------------------------------------------------------------------------------------------- no TVM
def test_generator_is_deterministic():
    for seed in range(30):
        assert generate(seed).model.SerializeToString() == generate(seed).model.SerializeToString()
    assert len({generate(s).model.SerializeToString() for s in range(30)}) == 30
    g = generate(5, dynamic=True)
    assert [f["x"].tobytes() for f in g.feeds()] == [f["x"].tobytes() for f in g.feeds()]


def test_generated_graphs_are_valid_and_run_in_onnxruntime():
    seen: set[str] = set()
    dynamic = spatial = 0
    for seed in range(300):
        g = generate(seed)
        onnx.checker.check_model(g.model, full_check=True)
        seen.update(g.op_types)
        dynamic += bool(g.dynamic_dims)
        spatial += "W" in g.dynamic_dims
        feeds = g.feeds()
        refs = reference(g.model, feeds)
        for k, (feed, outs) in enumerate(zip(feeds, refs)):
            for vi, out in zip(g.model.graph.output, outs):
                dims = vi.type.tensor_type.shape.dim
                want = [d.dim_value if d.HasField("dim_value") else ENVS[k][d.dim_param] if d.dim_param else None
                        for d in dims]
                assert out.ndim == len(want) and all(w in (None, s) for w, s in zip(want, out.shape)), \
                    (g.description, vi.name, want, out.shape)
                if out.dtype == np.float32:
                    assert np.isfinite(out).all(), (g.description, vi.name)
    assert REQUIRED_OPS <= seen, sorted(REQUIRED_OPS - seen)
    assert 100 < dynamic < 200 and spatial > 20


def test_dynamic_graphs_are_fed_at_several_sizes():
    g = generate(3, dynamic=True)
    assert g.dynamic_dims.get("N") == (1, 8)
    assert sorted(f["x"].shape[0] for f in g.feeds()) == [1, 3, 8]
    static = generate(3, dynamic=False)
    assert not static.dynamic_dims and len(static.feeds()) == 2


def test_generator_respects_ops_and_max_nodes():
    g = generate(11, ops={"Conv", "Relu"}, max_nodes=3, dynamic=False)
    assert set(g.op_types) <= {"Conv", "Relu", "Abs", "Add", "Clip"} and 1 <= len(g.op_types)


def test_shrink_minimizes_and_keeps_the_model_valid():
    seed = next(s for s in range(100) if "Softmax" in generate(s).op_types and len(generate(s).op_types) > 6)
    model = generate(seed).model
    small = shrink(model, lambda m: any(n.op_type == "Softmax" for n in m.graph.node))
    assert [n.op_type for n in small.graph.node] == ["Softmax"]
    onnx.checker.check_model(small, full_check=True)
    reference(small, feeds_for(small))


def test_compare_and_normalize():
    ref = np.array([1.0, -2.0, 100.0], np.float32)
    assert compare(ref + 1e-3, ref, 1e-3, 1e-4)[0] is None  # within atol * max|ref|
    assert compare(ref + np.array([0, 0.5, 0], np.float32), ref, 1e-3, 1e-4)[0] == "wrong-result"
    assert compare(ref[:2], ref, 1e-3, 1e-4)[0] == "wrong-shape"
    assert compare(np.array([1, 2]), np.array([1, 3]), 0, 0)[0] == "wrong-result"
    assert normalize("TVM failed to compile for llvm -mcpu=x: shape lv12 of 'x_3' is (1, 8)") == \
        normalize("TVM failed to compile for host: shape lv3 of 'y' is (4, 2)")


def test_a_crash_in_the_worker_is_classified(worker):
    messages = worker.run({"selftest": "segv", "model": b""}, timeout=60)
    assert messages[-1][:3] == ("crash", "SIGSEGV", 0)


# ---------------------------------------------------------------------------------------------- TVM
def test_fuzz_smoke(worker):
    unknown = []
    for seed in range(8):
        unknown += _unknown(seed, check(generate(seed), LEVELS, worker=worker))
    assert not unknown, "\n".join(unknown)


@pytest.mark.parametrize("path", sorted(ASSETS.glob("*.onnx")), ids=lambda p: p.name)
def test_regression_asset(path, worker, request):
    if path.name in KNOWN_FAILURES:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_FAILURES[path.name], strict=True))
    result = check(path, LEVELS, worker=worker, quantize=path.name.startswith("quant_"))
    assert result.ok, "\n".join(f"{f.cls} (max error {f.max_error})" for f in result.bugs)


#: opt levels of the slow slice, by seed % 5: every level in 2 of 5 graphs
LEVEL_SETS = [(0, 3), (1, 4), (2, 3), (0, 4), (1, 2)]


@pytest.mark.slow
def test_fuzz_slice(worker):
    unknown = []
    for seed in range(1000, 1250):
        graph = generate(seed)
        unknown += _unknown(seed, check(graph, LEVEL_SETS[seed % 5], worker=worker))
        if seed % 10 == 0:  # int8 (calibrated, per channel) judged by cosine with fp32 onnxruntime
            unknown += _unknown(seed, check(graph, (3,), quantize=True, worker=worker))
    assert not unknown, f"{len(unknown)} unknown failures:\n" + "\n".join(unknown)
