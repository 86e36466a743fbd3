"""Injective kernels over an innermost axis of no whole number of vectors, in all no whole number of vectors,
that read their inputs at other indices (transposes, slices, broadcasts): vector lanes along that axis, the
cut last vector split off (rules/common._ragged_rows), equal to onnxruntime.

The class: a YOLO head's anchors at most input sizes (3549 at 416x416), an image model's NCHW output of odd
width, a channel broadcast over such a map.  The fused loop did not vectorize at all.  Also here: injective
kernels of a dynamic batch, parallel over the batch alone (common._parallel_inside_batch).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_close, ort_run, scheduled_kernels, vectorized_tir
from test_backends_cpu import _model


def _transpose(shape, perm):
    return _model([helper.make_node("Transpose", ["x"], ["t"], perm=perm), helper.make_node("Relu", ["t"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [])


def _bias(shape):
    """A per-channel add over an NCHW map (no conv, so it stays NCHW): the bias is a broadcast read."""
    b = numpy_helper.from_array(np.linspace(-1, 1, shape[1], dtype=np.float32).reshape(1, -1, 1, 1), "b")
    return _model([helper.make_node("Add", ["x", "b"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [b])


def _slice(shape, start):
    """One row cut from ``start`` on: its reads are offset, and the row alone is the parallel work."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in (([start], "s"), ([shape[-1]], "e"),
                                                                           ([len(shape) - 1], "a"))]
    return _model([helper.make_node("Slice", ["x", "s", "e", "a"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


CASES = {
    "YOLO head anchors at 416: [1, 3549, 22] -> [1, 22, 3549]": (lambda: _transpose([1, 3549, 22], [0, 2, 1]),
                                                              [1, 3549, 22]),
    "an RGB image out, NHWC -> NCHW, 55 wide": (lambda: _transpose([1, 55, 55, 3], [0, 3, 1, 2]), [1, 55, 55, 3]),
    "channel bias over 13 x 13": (lambda: _bias([1, 36, 13, 13]), [1, 36, 13, 13]),
    "channel bias over 8 x 6, whole vectors once H and W are fused": (lambda: _bias([2, 32, 8, 6]), [2, 32, 8, 6]),
    "one row of 3549 sliced from 3600": (lambda: _slice([1, 3600], 51), [1, 3600]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ragged_rows_vectorize_without_per_lane_division(case) -> None:
    import tvm

    make, shape = CASES[case]
    model = make()
    mod, run = scheduled_kernels(model, {"x": shape})
    kernels = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(kernels) == 1, [gv.name_hint for gv in mod.functions]
    text = vectorized_tir(kernels[0])
    assert "T.Ramp" in text, text  # vectorized (a total of no whole vectors was not)
    assert "// T.Broadcast" not in text and "% T.Broadcast" not in text, text  # no lane computes its row
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])


def test_rows_of_a_few_vectors_keep_the_small_axis_path() -> None:
    """H x W fused into rows (common._fuse_contiguous_tail) only where that pays: rows of whole vectors, or rows
    long enough that a cut vector is a small part of them.  A bias over [8, 512, 7, 7] (a total of whole vectors,
    so the fused loop would divide per lane to find each lane's channel: 206 us against 17) keeps the unrolled
    small-axis path; equal to onnxruntime."""
    import tvm

    shape = [8, 512, 7, 7]
    model = _bias(shape)
    mod, run = scheduled_kernels(model, {"x": shape})
    [kernel] = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    text = vectorized_tir(kernel)
    assert "// T.Broadcast" not in text and "% T.Broadcast" not in text, text
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])


def _concat_nhwc(batch):
    """Two convs concatenated on channels (NHWC after layout conversion), the batch as given."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 8, 1, 1)) * 0.3).astype(np.float32), f"w{i}")
             for i in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]), helper.make_node("Conv", ["x", "w1"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1), helper.make_node("Sigmoid", ["c"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, 40, 40])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def test_a_dynamic_batch_is_not_the_only_parallel_loop() -> None:
    """The class: injective kernels (concatenations, slices, transposes, activations no conv took) of a model
    whose batch is dynamic, as most exporters leave it.  They were parallel over the batch alone, so at batch 1
    they ran on one core; the parallel loop is now inside it (common._parallel_inside_batch)."""
    import tvm

    model = _concat_nhwc("N")
    mod, run = scheduled_kernels(model, {"x": ["N", 8, 40, 40]})
    (text,) = [f.script() for gv, f in mod.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc) and "concatenate" in gv.name_hint]
    assert "T.parallel(T.int64(1280))" in text, text  # 40 x 40 pixels, inside the batch
    assert "T.parallel(N" not in text, text  # was: over the batch alone
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 8, 40, 40)).astype(np.float32)
        assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])


def _slice_batch():
    """The last item of a dynamic batch: a static [1, 2, 27] out of an [N, 2, 27] input."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for v, n in (([-1], "s"), ([np.iinfo(np.int64).max], "e"), ([0], "a"))]
    return _model([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 27])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def _cast_int():
    return _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT32)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 71])],
                  [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [])


@pytest.mark.parametrize("level", [3, 4])
@pytest.mark.parametrize("case", ["slice of a dynamic batch", "cast to int32"])
def test_kernels_the_partition_hint_must_not_reach_still_compile(case, level) -> None:
    """Found by the differential fuzzer (seeds 1076, 1018, 1113): a ragged kernel whose buffers are symbolic or
    integers is not indexed in int32 by stack_tiles.keep_partition_hints, so a hinted static loop in it made
    LoopPartition mix int32 and int64 ("mismatched types"), and TVM refused to narrow the float -> int32 cast
    ("op->value <= max_value").  Such kernels take no hint (stack_tiles.hint_partition, narrowable)."""
    import forgekit as forge

    model, shape = (_slice_batch(), [3, 2, 27]) if case.startswith("slice") else (_cast_int(), [3, 71])
    run = forge.from_onnx(model).get_inference_function("host", opt_level=level)
    x = (np.random.default_rng(level).standard_normal(shape) * 100).astype(np.float32)
    got, want = np.asarray(run(x)), ort_run(model, {"x": x})[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
