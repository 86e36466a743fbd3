"""Two CPU kernel shapes the GRU audio model showed slow (forgekit/backends/cpu: packed_conv's matmul
legalization picks the row axis, rules/tiled.py the register axis; fast_math.py's sigmoid).

* ``[T, 1, K] x [K, N]`` (a time-major recurrent layer's input projection, batch 1): the rows are the
  ``T`` time steps, not the 1-long axis.  Tiled one row at a time, every multiply-add loaded its own
  weight vectors: 1.08 ms at T=300, K=257, N=384 (numpy's sgemm: 0.34 ms); now 0.53 ms, static or dynamic.
* sigmoid as ``1 / (1 + fast_exp(-x))``: vectorized, where libm's expf was a scalar call per element
  (a 300 x 257 sigmoid head: 0.43 -> 0.23 ms).  Accurate to 2e-7 relative even at x = -17, where
  onnxruntime's own sigmoid is off by a factor of 5.5.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from conftest import assert_close, ort_run, scheduled_kernels


def _projection(t: int | str, k: int = 37, n: int = 48):
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((k, n)).astype(np.float32) * 0.2, "w")
    b = numpy_helper.from_array(np.random.default_rng(2).standard_normal(n).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    graph = helper.make_graph(nodes, "proj", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [t, 1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _scheduled(model, shape_dict) -> tuple[str, object]:
    import tvm

    mod, run = scheduled_kernels(model, shape_dict)
    return "\n".join(f.script() for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)), run


@pytest.mark.parametrize("t", [30, "T"])
def test_time_major_projection_tiles_the_time_steps(t) -> None:
    model = _projection(t)
    text, run = _scheduled(model, {"x": [t, 1, 37]})
    # the register tile runs over the time axis (was: a 1-row tile, ``for i1_1 in T.unroll(T.int64(1))``)
    # and, T symbolic, over whole tiles of it (no bounds predicate on each multiply-add)
    assert "T.unroll(T.int64(1))" not in text and "T.where(i0_0" not in text, text
    for steps in (1, 7, 30):
        if t != "T" and steps != t:
            continue
        x = np.random.default_rng(steps).standard_normal((steps, 1, 37)).astype(np.float32)
        assert_close(run(x), ort_run(model, {"x": x})[0])


def test_sigmoid_is_vectorized_and_accurate_in_the_tail() -> None:
    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4096])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4096])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    text, run = _scheduled(model, {"x": [1, 4096]})
    assert "T.sigmoid(" not in text and "T.exp(" not in text  # the polynomial exp, not a libm call
    x = np.linspace(-20, 20, 4096, dtype=np.float32)[None]
    exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert float((np.abs(run(x) - exact) / exact).max()) < 1e-6


def test_rounding_half_to_even_stays_vectorized() -> None:
    """The class: kernels that round half to even (ONNX Round, relax round: an int8 conv's sums rounded back
    from fp32 Winograd, int8_winograd).  topi's round is ``tirx.nearbyint``, which TVM 0.27 does not mark
    vectorizable: VectorizeLoop scalarized the whole loop, and the epilogue fused with it (LLVM then
    re-vectorized 4 pixels at a time with per-element gathers).  Now an ``llvm.nearbyint`` call
    (fast_math.legalize_round): the loop stays vectorized, and ties still go to even as onnxruntime rounds."""
    import tvm
    import tvm.s_tir

    nodes = [helper.make_node("Round", ["x"], ["r"]), helper.make_node("Mul", ["r", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])],
                              [numpy_helper.from_array(np.linspace(0.5, 2, 256, dtype=np.float32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    mod, run = scheduled_kernels(model, {"x": [64, 256]})
    kernels = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    (name,) = [n for n in kernels if "round" in n]
    lower = tvm.transform.Sequential([tvm.s_tir.transform.LowerInitBlock(), tvm.s_tir.transform.ConvertBlocksToOpaque(),
                                      tvm.s_tir.transform.LowerOpaqueBlock(), tvm.tirx.transform.VectorizeLoop()])
    with tvm.target.Target("llvm"):
        lowered = lower(tvm.IRModule({name: kernels[name]}))
    assert "float32x" in lowered[name].script(), lowered[name].script()  # was: a scalar loop
    x = np.random.default_rng(0).uniform(-8, 8, (64, 256)).astype(np.float32)
    x[0, :8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 4.5]  # ties: to even
    np.testing.assert_array_equal(run(x), ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("classes,padded", [(6625, True), (1000, True), (100, True), (50, False), (128, False)])
def test_softmax_rows_of_any_length_are_whole_vectors(classes, padded) -> None:
    """A softmax row of 6625 classes (PP-OCRv4 rec's CTC head) was reduced one scalar at a time (6625 is not
    a multiple of the lanes): its rows are now padded with the lowest float for the reductions, which then
    run vectorized (1.04 -> 0.36 ms alone); the outputs equal onnxruntime's, saturated rows included."""
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, classes])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, classes])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    text, run = _scheduled(model, {"x": [3, classes]})
    assert ("_rf" in text) == (classes >= 64), text[:2000]  # the lanes-wide partial max/sum (rfactor)
    assert ("PadInput" in text) == padded  # the padded copy the reductions read (inlined)
    x = np.random.default_rng(0).standard_normal((3, classes)).astype(np.float32) * 3
    x[2, 7] = 60.0  # one saturated row
    assert_close(run(x), ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("rows", [101, 197])
def test_prime_row_counts_get_whole_register_tiles(rows: int) -> None:
    """ViT's token counts (the class token on 10x10 or 14x14 patches): 101 and 197 are prime, so the register
    tile (a divisor of the rows) was 1 row, every weight vector load feeding one multiply-add: a small ViT ran
    2.1x onnxruntime's latency (red-team).  The kernel now computes an even few more rows (112, 210) in
    7-row tiles, the extra ones from a clamped input row, sliced off."""
    k = n = 96
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((k, n)).astype(np.float32) * 0.2, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "tokens",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    text, run = _scheduled(model, {"x": [1, rows, k]})
    assert "T.unroll(T.int64(1))" not in text and "T_slice_n" in text, text
    x = np.random.default_rng(rows).standard_normal((1, rows, k)).astype(np.float32)
    assert_close(run(x), ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("mcpu", ["haswell", "znver3", "x86-64-v4", "skylake-avx512"])
def test_prime_row_counts_are_padded_on_every_vector_width(mcpu: str) -> None:
    """On AVX2 (8 accumulators) the padded tile's reuse is at most twice the 1-row tile's, and weighing it by the
    rows it adds (197/198) kept it under the bar, so AVX2 hosts ran ViT's 197 tokens in 1-row tiles: [197, 768]
    x [768, 768] 2.54 -> 1.38 ms on a Zen 3 once padded (onnxruntime 1.26).  On AVX-512 a prime up to 23 fits
    one tall tile of one vector (19 x 1, each broadcast feeding one multiply-add), which is padded as well: 13
    and 19 pixels were left so (a 1x1 conv 256->64 on 19x19: 82.8 us, padded to 5 x 4: 41.9).  Checked for any
    host by target."""
    import tvm

    from forgekit.backends.cpu.tiling import choose_tiles, padded_rows
    from forgekit.targets.isa import isa_info

    tinfo = isa_info(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    for cols, rows in ((96, 197), (768, 197), (384, 101), (64, 19), (64, 13)):
        padded = padded_rows(cols, rows, tinfo)
        assert rows < padded <= rows + max(2, rows // 8) and choose_tiles(cols, padded, tinfo)[1] >= 2, (cols, rows)
    assert padded_rows(96, 196, tinfo) == 196  # 196 = 4 * 49 already has good tiles


def test_prime_output_widths_get_whole_register_tiles() -> None:
    """The same for a convolution's output width (the register axis of its tile): 19 pixels, 20 computed."""
    w = numpy_helper.from_array(np.random.default_rng(2).standard_normal((64, 32, 1, 1)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "wide",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 19, 19])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    text, run = _scheduled(model, {"x": [1, 32, 19, 19]})
    assert "T.unroll(T.int64(1))" not in text and "T_slice_oc" in text, text
    x = np.random.default_rng(3).standard_normal((1, 32, 19, 19)).astype(np.float32)
    assert_close(run(x), ort_run(model, {"x": x})[0])


def test_attention_on_a_prime_token_count_is_tiled() -> None:
    """q @ k^T and softmax @ v on 101 tokens (static): the columns (101) are not whole vectors and the rows
    have no register tile, so the stock kernel ran one column at a time (4.8 GFLOP/s in a small ViT); they are
    padded as a symbolic sequence's are now (zero columns, clamped rows, sliced off)."""
    heads, s, d = 3, 101, 32
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["sc"]),
             helper.make_node("Softmax", ["sc"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [heads, s, d]) for n in ("q", "k", "v")]
    graph = helper.make_graph(nodes, "attn", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    text, run = _scheduled(model, {n: [heads, s, d] for n in ("q", "k", "v")})
    assert text.count("T_slice_n") >= 2 and "T_pad_cols" in text, text
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((heads, s, d)).astype(np.float32) for _ in range(3))
    assert_close(run(q, k, v), ort_run(model, {"q": q, "k": k, "v": v})[0])
