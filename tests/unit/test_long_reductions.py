"""Long fp32 sums (forgekit/passes/long_reductions.py): summed in blocks at every opt level and precision.

TVM's one-accumulator sum stalls at 2^24 times an element: ReduceSum of 2^25 ones returned 16,777,216, 2^22
values in [0.05, 0.15) summed 1.6e-3 low, 2^20 copies of one value (a flat image) 1.4e-2 (level 4's 16-64
vector partial sums hide most of it: 2.6e-7 on the random values).  Each case is
judged against the float64 result (onnxruntime on the model in double): forgekit must be within 1e-4 of it.
Sizes: 2^22 elements per sum (16 MB per row), where the sequential error is large and a case runs in ~1 s."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import ort_run
from test_backends_cpu import _model
from test_bf16 import needs_bf16
from test_column_reduction import _reduce, _softmax

N = 1 << 22  # elements per sum: fp32 summed in sequence is 1.6e-3 low on _values
TOL = 1e-4  # measured error of the blocked sums: <= 5e-6 on these cases (1.6e-3 and up at levels 0-3 without)
LEVELS = [0, 1, 2, 3, 4]


def _values(shape, seed: int = 0, spread: float = 0.05) -> np.ndarray:
    """Positive values with a mean of 0.1 (an image's mean intensity, probabilities) rounded to bf16 so that
    the bf16 build's rounding of its conv inputs changes nothing; ``spread`` 0: a flat image, which int8
    quantization keeps exact too."""
    x = np.random.default_rng(seed).uniform(0.1 - spread, 0.1 + spread, shape).astype(np.float32)
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def _one(op, shape, inits=(), inputs=("x",), **attrs):
    return _model([helper.make_node(op, list(inputs), ["y"], **attrs)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))


def _instance_norm(shape):
    c = shape[1]
    inits = [numpy_helper.from_array(np.ones(c, np.float32), "g"), numpy_helper.from_array(np.zeros(c, np.float32), "b")]
    return _one("InstanceNormalization", shape, inits, ("x", "g", "b"))


def _double(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model in float64: onnxruntime's double kernels give the reference the fp32 builds are judged by."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float64), init.name))
    return model


def assert_accurate(got: np.ndarray, model: onnx.ModelProto, x: np.ndarray, exact=None, tol: float = TOL) -> None:
    """``got`` within ``tol`` of the float64 result, scaled by its largest magnitude: onnxruntime running the
    model in double, or ``exact`` (numpy) for ops onnxruntime has no double kernel of.  onnxruntime's float
    build is not the yardstick: its column sums are 1.8e-3 off at 2^22, its AveragePool 1 %."""
    x64 = x.astype(np.float64)
    exact = exact(x64) if exact is not None else ort_run(_double(model), {"x": x64})[0]
    scale = float(np.max(np.abs(exact)))

    def error(a: np.ndarray) -> float:
        return float(np.max(np.abs(np.asarray(a, np.float64).reshape(exact.shape) - exact))) / scale

    ours = error(got)
    assert ours <= tol, f"error {ours:.2e} (onnxruntime's float build: {error(ort_run(model, {'x': x})[0]):.2e})"


def _normalized(x: np.ndarray) -> np.ndarray:
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)


CASES = {  # name: (model, input shape[, float64 result]); symbolic dims (L, bounded by 2^23) are named in the
    # model, sized in the shape
    "ReduceSum trailing": (lambda: _reduce("ReduceSum", [2, N], [1], 0), [2, N]),
    "ReduceSum leading": (lambda: _reduce("ReduceSum", [N, 2], [0], 1), [N, 2]),
    "ReduceMean middle": (lambda: _reduce("ReduceMean", [2, N // 2, 2], [1], 1), [2, N // 2, 2]),
    "ReduceMean all axes": (lambda: _one("ReduceMean", [2, 1024, 2048], keepdims=0), [2, 1024, 2048]),
    "ReduceSumSquare trailing, prime extent": (lambda: _reduce("ReduceSumSquare", [2, 4194301], [1], 1),
                                               [2, 4194301]),
    "ReduceL2 leading": (lambda: _reduce("ReduceL2", [N, 2], [0], 0), [N, 2]),
    "GlobalAveragePool 2048x2048": (lambda: _one("GlobalAveragePool", [1, 2, 2048, 2048]), [1, 2, 2048, 2048],
                                    lambda x: x.mean((2, 3), keepdims=True)),
    "AveragePool as a mean over H": (lambda: _one("AveragePool", [1, 2, 1 << 20, 2], kernel_shape=[1 << 20, 1]),
                                     [1, 2, 1 << 20, 2], lambda x: x.mean(2, keepdims=True)),
    "Softmax trailing": (lambda: _softmax([2, N], -1), [2, N]),
    "Softmax middle": (lambda: _softmax([2, N // 2, 2], 1), [2, N // 2, 2]),
    "LogSoftmax leading": (lambda: _one("LogSoftmax", [N, 2], axis=0), [N, 2]),
    "InstanceNormalization (variance)": (lambda: _instance_norm([1, 2, N]), [1, 2, N], _normalized),
    "ReduceSum symbolic trailing": (lambda: _reduce("ReduceSum", [2, "L"], [1], 0), [2, N + 7]),
    "ReduceMean symbolic leading": (lambda: _reduce("ReduceMean", ["L", 2], [0], 0), [N + 5, 2]),
    "Softmax symbolic": (lambda: _softmax([2, "L"], -1), [2, N - 3]),
}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_long_sums_match_the_float64_result(case: str, level: int) -> None:
    from forgekit.backends import cpu

    make, shape, *exact = CASES[case]
    model = make()
    x = _values(shape)
    cpu.STATS.clear()
    dynamic = {"L": f"1..{1 << 23}"} if "symbolic" in case else None  # unbounded: left alone (see below)
    got = forge.from_onnx(model, dynamic=dynamic).get_inference_function("host", opt_level=level)(x)
    assert_accurate(got, model, x, *exact)
    if level >= 3:  # the blocks scheduled by a rule of their kind
        blocks = {name: rule for name, rule in cpu.STATS.items() if "block_sum" in name}
        assert blocks and "fallback" not in blocks.values(), cpu.STATS
        assert case in FELL_BACK or "fallback" not in cpu.STATS.values(), cpu.STATS


#: the plain mean fell back too (to a scalar, or a column mean over a symbolic length: ReductionRule finds no
#: row loop); now only its last stage does, over the blocks' sums (1024 and 1025 of them)
FELL_BACK = {"ReduceMean all axes", "ReduceMean symbolic leading"}


@pytest.mark.parametrize("level", LEVELS)
def test_2_25_ones(level: int) -> None:
    """The issue's case: 2^25 ones summed to 2^24 (exit 0) at levels 0-3."""
    model = _reduce("ReduceSum", [1 << 25], [0], 0)
    got = forge.from_onnx(model).get_inference_function("host", opt_level=level)(np.ones(1 << 25, np.float32))
    assert float(np.asarray(got)) == float(1 << 25)


def _conv_then_pool(channels: int, size: int) -> onnx.ModelProto:
    """An identity 3x3 conv (int8 or bf16 in those builds; exact on bf16 values) before a global average pool
    over size x size pixels, which stays fp32 in every precision."""
    w = np.zeros((channels, channels, 3, 3), np.float32)
    w[:, :, 1, 1] = np.eye(channels)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])


@pytest.mark.parametrize("level", LEVELS)
def test_int8_build_sums_in_blocks(level: int) -> None:
    """int8 convs, fp32 pool: the pool sums as many elements as in an fp32 build."""
    from forgekit.backends import cpu

    model = _conv_then_pool(16, 1024)
    x = _values([1, 16, 1024, 1024], spread=0)  # 2^20 pixels: the sequential sum is 1 % low
    ir = forge.from_onnx(model)
    ir.quantize(quant_type="dynamic")
    cpu.STATS.clear()
    got = ir.get_inference_function("host", opt_level=level)(x)
    assert level < 3 or any(rule.startswith("gemm_int8") for rule in cpu.STATS.values()), cpu.STATS
    assert_accurate(got, model, x, lambda x: x.mean((2, 3), keepdims=True))


@needs_bf16
@pytest.mark.parametrize("level", [3, 4])
def test_bf16_artifact_sums_in_blocks(level: int, tmp_path) -> None:
    """bf16 convs (levels 3-4 only), fp32 pool; the shipped artifact, its compile_report's rules included."""
    import json

    from forgekit.runtime import Engine

    model = _conv_then_pool(16, 1024)  # bf16 convs need 9+ output channels
    x = _values([1, 16, 1024, 1024], spread=0)
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / "bf16", opt_level=level,
                                            set_bfloat16=True, export_metadata=True)
    assert_accurate(Engine(result.path).infer(x)[0], model, x, lambda x: x.mean((2, 3), keepdims=True))
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    assert "gemm_bf16" in rules.values() and "fallback" not in rules.values(), rules
    assert any("block_sum" in name for name in rules), rules


ORDINARY = {  # name: (model, --dynamic bounds): sums short enough for one accumulator, or of unknown length
    "ResNet's 7x7 GlobalAveragePool": (lambda: _one("GlobalAveragePool", [1, 2048, 7, 7]), None),
    "EfficientNet's 112x112 squeeze (12544)": (lambda: _one("GlobalAveragePool", [1, 32, 112, 112]), None),
    "BERT's softmax over 128": (lambda: _softmax([1, 12, 128, 128], -1), None),
    "LayerNorm-style ReduceMean over 4096": (lambda: _reduce("ReduceMean", [1, 128, 4096], [-1], 1), None),
    "softmax over L <= 16384": (lambda: _softmax([1, 12, "L", "L"], -1), {"L": "1..16384"}),
    # unbounded: the split cost 2 kernels for 1 at any size (+175 % on a dynamic 7x7 pool, 0.07 -> 0.19 ms)
    "GlobalAveragePool over unbounded H, W": (lambda: _one("GlobalAveragePool", [1, 512, "H", "W"]), None),
    "softmax over unbounded L": (lambda: _softmax([1, 12, "L", "L"], -1), None),
}


@pytest.mark.parametrize("case", sorted(ORDINARY))
def test_ordinary_reductions_are_left_alone(case: str) -> None:
    """No cost where the sequential error is small (<= 2^14 elements: 3.5e-7 measured) or the length unknown:
    the pass returns the module it was given."""
    from forgekit.passes.long_reductions import split_long_sums

    make, dynamic = ORDINARY[case]
    mod = forge.from_onnx(make(), dynamic=dynamic).mod
    assert split_long_sums(mod) is mod


def _three_sums() -> onnx.ModelProto:
    """A trailing sum, a leading mean and a softmax over rows of N, in one model."""
    axes = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
             helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=0),
             helper.make_node("Softmax", ["x"], ["p"], axis=-1)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, N])],
                  [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in "smp"], axes)


def _have_nvcc() -> bool:
    import os
    import shutil

    from forgekit.backends.cuda.nvcc import _wheel_nvcc

    return bool(os.environ.get("CUDA_HOME") or shutil.which("nvcc") or _wheel_nvcc())


@pytest.mark.skipif(not _have_nvcc(), reason="needs nvcc (pip install 'forgekit[cuda]')")
@pytest.mark.parametrize(("level", "fp16"), [(0, False), (2, False), (3, False), (3, True)])
def test_cuda_build_compiles_the_blocks(level: int, fp16: bool, tmp_path) -> None:
    """The GPU path (DLight from level 2, unfused below; fp16 through ToMixedPrecision) compiles both stages."""
    result = forge.from_onnx(_three_sums()).compile(target="cuda -arch=sm_80", output_path=tmp_path / "gpu",
                                                    opt_level=level, set_float16=fp16)
    assert b"block_sum" in result.library.read_bytes()


#: means over two symbolic axes (a detector's global pool or squeeze-excite with --dynamic H, W): NCHW, then
#: NHWC (what the CPU layout pass makes of it), then a 3-D sequence mean
SYMBOLIC_2D = {
    "GlobalAveragePool over H, W <= 2048": (lambda: _one("GlobalAveragePool", [1, 8, "H", "W"]),
                                            {"H": "32..2048:32", "W": "32..2048:32"}, [(64, 96), (2048, 1024)],
                                            lambda x: x.mean((2, 3), keepdims=True)),
    "ReduceMean over L x 96, L <= 4096": (lambda: _reduce("ReduceMean", [1, "L", 96], [1, 2], 1),
                                          {"L": "1..4096"}, [(37,), (4096,)], None),
}


@pytest.mark.parametrize("case", sorted(SYMBOLIC_2D))
def test_a_mean_over_symbolic_rows_is_split_by_whole_rows(case: str) -> None:
    """A symbolic axis over long enough inner sums is split one index per block: no masked tail, whose index
    arithmetic on a symbolic block size made LLVM take 25 s per kernel (PP-OCRv6 det with dynamic H, W: six such
    pools, 10-12 min to compile, 64 s now).  Still blocked (the 2-stage error) and matching at two sizes."""
    from tvm import relax, tirx

    from forgekit.passes.long_reductions import plan, split_long_sums

    make, dynamic, sizes, exact = SYMBOLIC_2D[case]
    h, w = tirx.Var("H", "int64"), tirx.Var("W", "int64")
    assert plan([1, h, w, 8], [1, 2], {"H": 2048, "W": 2048}) == (1, 1, True)  # rows of W summed whole
    model = make()
    ir = forge.from_onnx(model, dynamic=dynamic)
    split = split_long_sums(ir.mod)
    blocks = [f for gv, f in split.functions_items() if "block_sum" in gv.name_hint]
    assert blocks and not any(isinstance(f, relax.Function) for f in blocks)
    assert all("Select" not in f.script() and "T.min(" not in f.script() for f in blocks)
    run = ir.get_inference_function("host", opt_level=3)
    for size in sizes:
        x = _values([1, 8, *size] if len(size) == 2 else [1, *size, 96])
        assert_accurate(run(x), model, x, exact)
