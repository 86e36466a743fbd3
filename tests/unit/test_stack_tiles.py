"""Matmuls that stream their weights from beyond the L2, and the register tiles on the stack they need
(forgekit/backends/cpu/stack_tiles.py, tiling.choose_tiles(streaming=True)).

A matmul of a few rows over large weights (a CTC or vocabulary head: ddddocr's [T, 1024] x [1024, 8210], an
LSTM's input projection) is bound by reading its weights: its default 4-row tile read each 8 MB-33 MB panel
set twice per 8 rows, at 5.1 ms against onnxruntime's 2.4 ([8, 1024] x [1024, 8210], this Xeon).  An 8-row
tile of 2 AVX-512 vectors holds 16 accumulators, 1 KB: TVM serves an allocation of 1 KB or more from its
workspace pool, out of registers.  The CPU TIR pipeline keeps tiles under 2 KB on the stack."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import forgekit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run  # noqa: E402

AVX512 = "llvm -mcpu=sapphirerapids"


def _matmul(rows: int | str, k: int, n: int):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((k, n)) * 0.05).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])], "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _build(model: Any, target: str, tmp_path: Path) -> tuple[Any, str]:
    """(the module as the Relax pipeline leaves it, the LLVM IR of its kernels) of a level-3 build for
    ``target``, which need not run here."""
    import tvm

    captured = {}
    real = tvm.compile

    def capture(mod: Any, target: Any = None, relax_pipeline: Any = None, **kwargs: Any) -> Any:
        captured["mod"] = relax_pipeline(mod)
        executable = real(mod, target=target, relax_pipeline=relax_pipeline, **kwargs)
        captured["ll"] = executable.mod.imports[0].inspect_source("ll")
        return executable

    tvm.compile = capture
    try:
        forgekit.from_onnx(model).compile(target, output_path=str(tmp_path / "out"), opt_level=3)
    finally:
        tvm.compile = real
    return captured["mod"], captured["ll"]


def _row_tile(mod: Any) -> int:
    """The unrolled row extent of the matmul's register tile."""
    import re

    [script] = [f.script() for gv, f in mod.functions_items() if "matmul" in gv.name_hint and hasattr(f, "body")]
    return int(re.findall(r"in T\.unroll\(T\.int64\((\d+)\)\)", script)[0])


@pytest.mark.parametrize("rows", [8, "T"])
def test_a_matmul_over_large_weights_reads_each_panel_once(rows: int | str, tmp_path: Path) -> None:
    """[8 or T, 1024] x [1024, 2048] (8 MB of weights) for AVX-512: all 8 rows in one tile of 16 accumulators
    (a symbolic T is rounded up to it), on the stack: no workspace allocation in the kernel.  Weights that stay
    in the L2 ([1024, 128], 512 KB) kept a 4-row tile while a tile's budget was TVM's 1 KB stack limit; with
    the whole register budget (:func:`.tiling.stack_budget`) they get 8 rows too.  Both match onnxruntime."""
    big, ll = _build(_matmul(rows, 1024, 2048), AVX512, tmp_path / "big")
    assert _row_tile(big) == 8
    assert "TVMBackendAllocWorkspace" not in ll
    small, _ = _build(_matmul(rows, 1024, 128), AVX512, tmp_path / "small")
    assert _row_tile(small) == 8
    model = _matmul(rows, 1024, 2048)
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=3)
    for m in ([8] if rows == 8 else [1, 8, 13]):
        x = np.random.default_rng(m).standard_normal((m, 1024)).astype(np.float32)
        assert_close(run(x), ort_run(model, {"x": x})[0])


def test_tiles_under_2_kb_stay_on_the_stack() -> None:
    """A 1.5 KB scratch buffer: TVM's default pipeline serves it from the workspace pool, forgekit's CPU
    pipeline keeps it an alloca; both compute the same."""
    import tvm

    from forgekit.backends.cpu.stack_tiles import tir_pipeline

    scratch = tvm.script.from_source(
        "@T.prim_func\n"
        "def scratch(a: T.Buffer((384,), 'float32'), b: T.Buffer((384,), 'float32')):\n"
        "    acc = T.alloc_buffer((384,), 'float32')\n"
        "    for i in range(384):\n"
        "        acc[i] = a[i] * T.float32(2)\n"
        "    for i in range(384):\n"
        "        b[i] = acc[383 - i] + T.float32(1)\n")
    x = np.arange(384, dtype=np.float32)
    for pipeline, workspace in (("default", True), (tir_pipeline(), False)):
        built = tvm.compile(scratch, target="llvm", tir_pipeline=pipeline)
        assert ("TVMBackendAllocWorkspace" in built.mod.inspect_source("ll")) is workspace, pipeline
        out = tvm.runtime.tensor(np.zeros(384, np.float32))
        built["scratch"](tvm.runtime.tensor(x), out)
        np.testing.assert_array_equal(out.numpy(), x[::-1] * 2 + 1)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_partition_hints_are_narrowed_or_dropped(dtype: str) -> None:
    """keep_partition_hints: a float kernel of static shape is indexed in int32 with its hint kept on the loop
    (NarrowDataType would otherwise rename the loop away from it); any other kernel keeps int64 and loses the
    hints of its static loops, which LoopPartition would then split in mixed int32/int64."""
    import tvm
    import tvm_ffi
    from tvm import te, tirx
    from tvm.s_tir import Schedule

    from forgekit.backends.cpu.stack_tiles import PARTITION_HINT, keep_partition_hints

    n = tirx.IntImm("int64", 100)
    x = te.placeholder((n,), dtype, name="x")
    y = te.compute((n,), lambda i: x[i] + tirx.const(1, dtype), name="y")
    sch = Schedule(te.create_prim_func([x, y]))
    outer, _ = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, 8])
    sch.annotate(outer, PARTITION_HINT, 1)  # as a rule would, without hint_partition's check
    func = keep_partition_hints()(sch.mod)["main"]
    loops = []
    tvm_ffi.structural_map(func.body, [(tirx.For, lambda node: loops.append(node) or node)], order="post")
    hinted = [lp for lp in loops if PARTITION_HINT in lp.annotations]
    if dtype == "float32":
        assert hinted and str(hinted[0].loop_var.ty) == "int32"
    else:
        assert not hinted and all(str(lp.loop_var.ty) == "int64" for lp in loops)
    with tvm.target.Target("llvm"):
        tvm.compile(tvm.IRModule({"main": func}), target="llvm")  # and it builds


def test_avx512_tiles_fill_the_register_budget(tmp_path: Path) -> None:
    """A tile may hold all of AVX-512's 24 accumulators (1.5 KB, on the stack in CPU builds), not the 15 that
    TVM's own 1 KB stack limit left: PP-OCRv6 rec's 1x1 convs over 80-pixel rows got 5 rows x 2 vectors, now
    5 x 4 (a 384->192 conv on 6x80: 192 -> 252 GFLOP/s on this Xeon).  The tile stays off the workspace pool;
    AVX2 keeps its 8 accumulators; the conv matches onnxruntime here."""
    import tvm
    from onnx import TensorProto, helper, numpy_helper

    from forgekit.backends.cpu.tiling import choose_tiles, stack_budget
    from forgekit.targets.isa import isa_info

    avx512 = isa_info(tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"}))
    assert stack_budget(avx512) == 24 and choose_tiles(192, 80, avx512) == (64, 5)
    assert stack_budget(isa_info(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"}))) == 8
    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((192, 384, 1, 1)) * 0.05)
                                .astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "pw",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 384, 6, 80])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _, ll = _build(model, AVX512, tmp_path)
    assert "TVMBackendAllocWorkspace" not in ll
    x = np.random.default_rng(1).standard_normal((1, 384, 6, 80)).astype(np.float32)
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=3)
    assert_close(run(x), ort_run(model, {"x": x})[0])
