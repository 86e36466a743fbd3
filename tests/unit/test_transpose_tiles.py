"""Transposing injective kernels in tiles (rules/common._tiled_transpose): the class is every elementwise kernel
that reads an input along an axis the output does not keep innermost, the input's innermost axis moving outward:
an NHWC -> NCHW output (each model output of a conv net, any width), attention's ``k^T`` and ``x.transpose(1, 2)``,
a YOLO head's [1, 84, 8400] -> [1, 8400, 84].  Fused and vectorized along the output's innermost axis, each such
kernel read one float per cache line and swept the whole input once per row of the transposed axis: 3.5-6x
slower than in tiles (the measurements are in the docstring).  Each case must schedule a tile of the transposed
axis around one vector of the output's innermost axis, stay vectorized, and equal onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from conftest import assert_close, ort_run, scheduled_kernels, vectorized_tir
from forgekit.backends.cpu.rules.common import TRANSPOSE_TILE
from test_backends_cpu import _model


def _transpose(shape, perm, add: bool = False):
    """ReLU(Transpose(x)); with ``add`` plus a second input already in the output's layout (two reads, one of
    them contiguous)."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    if add:
        nodes.append(helper.make_node("Add", ["t", "z"], ["s"]))
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [shape[p] for p in perm]))
    nodes.append(helper.make_node("Relu", ["s" if add else "t"], ["y"]))
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [])


CASES = {  # name: (shape, perm, second contiguous input)
    "NHWC -> NCHW, 56 wide (whole vectors)": ([1, 56, 56, 64], [0, 3, 1, 2], False),
    "NHWC -> NCHW, 55 wide (a cut last vector)": ([1, 55, 55, 64], [0, 3, 1, 2], False),
    "attention's k^T, 197 tokens": ([1, 12, 197, 64], [0, 1, 3, 2], False),
    "a YOLO head's [1, 84, 840] -> [1, 840, 84]": ([1, 84, 840], [0, 2, 1], False),
    "a batch of 2, plus a contiguous operand": ([2, 24, 40, 32], [0, 3, 1, 2], True),
}


def _tiled(func) -> bool:
    """Whether ``func`` has a serial loop of TRANSPOSE_TILE rows directly around a vectorized loop."""
    import tvm
    import tvm_ffi

    found = []

    def visit(node):
        if (node.kind == tvm.tirx.ForKind.SERIAL and isinstance(node.extent, tvm.tirx.IntImm)
                and int(node.extent) == TRANSPOSE_TILE and isinstance(node.body, tvm.tirx.For)
                and node.body.kind == tvm.tirx.ForKind.VECTORIZED):
            found.append(node)
        return node

    tvm_ffi.structural_map(func.body, [(tvm.tirx.For, visit)], order="post")
    return bool(found)


@pytest.mark.parametrize("case", sorted(CASES))
def test_transposing_reads_run_in_tiles(case) -> None:
    import tvm

    shape, perm, add = CASES[case]
    model = _transpose(shape, perm, add)
    shapes = {"x": shape, **({"z": [shape[p] for p in perm]} if add else {})}
    mod, run = scheduled_kernels(model, shapes)
    kernels = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(kernels) == 1, [gv.name_hint for gv in mod.functions]
    assert _tiled(kernels[0]), kernels[0].script()
    text = vectorized_tir(kernels[0])
    assert "T.Ramp" in text, text
    assert "// T.Broadcast" not in text and "% T.Broadcast" not in text, text  # no lane computes its row
    rng = np.random.default_rng(len(shape))
    feeds = {name: rng.standard_normal(s).astype(np.float32) for name, s in shapes.items()}
    out = run(*feeds.values())
    assert_close(np.asarray(out), ort_run(model, feeds)[0])


@pytest.mark.parametrize(("shape", "perm"), [([12, 197, 64], [1, 0, 2]), ([1, 64, 56, 20], [0, 2, 3, 1])])
def test_reads_along_the_innermost_axis_or_short_tiles_are_left_alone(shape, perm) -> None:
    """The innermost axis kept (only outer axes move: each vector is one contiguous load), or the input's innermost
    axis (20) no whole number of tiles: the schedule as before, still equal to onnxruntime."""
    import tvm

    model = _transpose(shape, perm)
    mod, run = scheduled_kernels(model, {"x": shape})
    kernels = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert not any(_tiled(k) for k in kernels)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])


@pytest.mark.parametrize(("shape", "perm"), [
    ([1, 32, "W", 24], [0, 3, 1, 2]),  # the NHWC -> NCHW output of a dynamic-width conv net
    ([2, 24, 8, "W"], [0, 1, 2, 3]),  # an elementwise kernel over a dynamic last axis, read in order
])
def test_a_symbolic_innermost_axis_stays_a_loop_inside_parallel_static_rows(shape, perm) -> None:
    """Only the innermost axis symbolic: the rows (the static axes) run in parallel and the symbolic axis is a loop
    inside each.  All fused into one parallel loop, every element paid two 64-bit divisions by the symbolic
    extent to find its row: [1, 32, W, 24] -> [1, 24, 32, W] at W=160 took 0.162 ms, now 0.075 (2 threads, an
    AVX-512 Xeon; its static twin, in tiles, 0.048)."""
    import tvm
    import tvm_ffi

    model = _transpose(shape, perm)
    mod, run = scheduled_kernels(model, {"x": shape})
    [kernel] = [f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint != "shape_func"]
    parallel = []

    def note(loop):
        if loop.kind == tvm.tirx.ForKind.PARALLEL:
            parallel.append(loop)
        return loop

    tvm_ffi.structural_map(kernel.body, [(tvm.tirx.For, note)], order="post")
    rows = int(np.prod([shape[p] for p in perm[:-1]]))
    assert [int(p.extent) for p in parallel if isinstance(p.extent, tvm.tirx.IntImm)] == [rows], kernel.script()
    for width in (5, 37, 160):
        x = np.random.default_rng(width).standard_normal([width if d == "W" else d for d in shape]).astype(np.float32)
        assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])
