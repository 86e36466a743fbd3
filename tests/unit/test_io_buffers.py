"""Inputs read where the caller put them, owned outputs handed over without a copy (backends/cpu/io_buffers.py).

``Engine.infer`` copied every input into a 64-byte aligned buffer (TVM's kernels assumed that alignment: a
16-byte aligned numpy array read directly crashed the process) and copied every output; on a Relu over
[1, 40, 16000] ``infer`` took 1.02 ms around a 0.15 ms kernel, onnxruntime's ``run`` 0.17 ms.  The class: every
CPU artifact's inputs (at any element-aligned address, C-contiguous or not, read-only or not; inputs read by
kernels of ``main``, of If branches and of Loop bodies) and its outputs (owned, views of inputs, constants,
two views of one storage), at levels 0 and 3.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from forgekit.runtime import Engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run  # noqa: E402
from onnx_models import loop_model  # noqa: E402
from test_backends_cpu import _model  # noqa: E402
from test_dataflow_control_flow import _gated_model  # noqa: E402

F32 = TensorProto.FLOAT


def _misaligned(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` at an address aligned to its element and never to 64 bytes (numpy's own arrays are
    16-byte aligned: 64 is luck)."""
    raw = np.empty(a.nbytes + 64 + a.itemsize, np.uint8)
    start = (-raw.ctypes.data) % 64 + a.itemsize
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _aliasing_model():
    """Five outputs: relu(x) (allocated by the call), reshape(x) (a view of the input), a constant, a reshape
    of relu(x) (a second view of the first output's storage) and x itself."""
    names = ["relu", "flat", "const", "flat_relu", "same"]
    nodes = [helper.make_node("Relu", ["x"], ["relu"]), helper.make_node("Reshape", ["x", "shape"], ["flat"]),
             helper.make_node("Identity", ["c"], ["const"]),
             helper.make_node("Reshape", ["relu", "shape"], ["flat_relu"]),
             helper.make_node("Identity", ["x"], ["same"])]
    inits = [numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "c"),
             numpy_helper.from_array(np.array([-1], np.int64), "shape")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [4, 16])],
                  [helper.make_tensor_value_info(n, F32, None) for n in names], inits)


def _compile(model, tmp_path: Path, level: int, shapes: dict | None = None) -> Path:
    out = tmp_path / f"a{level}"
    forge.from_onnx(model, shapes).compile("host", output_path=out, opt_level=level)
    return out


@pytest.mark.parametrize("level", [0, 3])
def test_outputs_are_handed_over_only_when_the_call_allocated_them(tmp_path: Path, level: int) -> None:
    """Owned: relu(x).  Copied: the view of x, x itself, the constant (read-only data: a writable view crashes
    on write) and the second view of relu's storage.  Writing to any output changes neither the input, nor
    the other outputs, nor the next call."""
    model = _aliasing_model()
    out = _compile(model, tmp_path, level)
    io = json.loads((out / "metadata.json").read_text())["build"]["io"]
    assert io == {"input_alignment": "element", "owned_outputs": [True, False, False, False, False]}
    engine = Engine(out)
    x = _misaligned(np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32))
    kept = x.copy()
    relu, flat, const, flat_relu, same = engine.infer(x)
    assert not relu.flags.owndata and all(o.flags.owndata for o in (flat, const, flat_relu, same))
    for got, want in zip((relu, flat, const, flat_relu, same), ort_run(model, {"x": kept})):
        assert_close(got, want)
    for o in (relu, flat, const, flat_relu, same):
        o[...] = 7.0
    np.testing.assert_array_equal(x, kept)
    again = engine.infer(x)
    for got, want in zip(again, ort_run(model, {"x": kept})):
        assert_close(got, want)


def test_a_kept_output_survives_the_next_calls(tmp_path: Path) -> None:
    """An owned output is the caller's: the VM's memory pool does not hand its storage to the next call."""
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F32, [64, 256])],
                   [helper.make_tensor_value_info("y", F32, None)], [])
    engine = Engine(_compile(model, tmp_path, 3))
    xs = [np.random.default_rng(k).standard_normal((64, 256)).astype(np.float32) for k in range(4)]
    kept = [engine.infer(x)[0] for x in xs]
    assert not kept[0].flags.owndata
    for x, y in zip(xs, kept):
        np.testing.assert_array_equal(y, np.maximum(x, 0))


def _kernel_pointers(engine: Engine, *inputs: np.ndarray) -> set[int]:
    """The data addresses of every tensor the VM passed to a kernel during one call."""
    seen: set[int] = set()

    def hook(_func, _symbol, before, _result, *args):
        if before:
            for a in args:
                if hasattr(a, "__dlpack__"):
                    seen.add(np.from_dlpack(a).ctypes.data)
        return 0

    engine.set_instrument(hook)
    try:
        engine.infer(*inputs)
    finally:
        engine.set_instrument(None)
    return seen


@pytest.mark.parametrize("level", [0, 3])
def test_kernels_read_inputs_where_the_caller_put_them(tmp_path: Path, level: int) -> None:
    """A conv (NHWC at level 3: a layout kernel reads the input), an add of a second input, a matmul: fed
    arrays 4 bytes past a 64-byte boundary, the kernels get the caller's addresses (no copy) and match
    onnxruntime; before, the Engine copied them (reading them in place crashed)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    m = numpy_helper.from_array((rng.standard_normal((16, 5)) * 0.3).astype(np.float32), "m")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "b"], ["s"]), helper.make_node("MatMul", ["s", "m"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, [1, 3, 16, 16]),
                           helper.make_tensor_value_info("b", F32, [1, 8, 16, 16])],
                   [helper.make_tensor_value_info("y", F32, None)], [w, m])
    engine = Engine(_compile(model, tmp_path, level))
    x = _misaligned(rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    b = _misaligned(rng.standard_normal((1, 8, 16, 16)).astype(np.float32))
    assert x.ctypes.data % 64 and b.ctypes.data % 64
    assert {x.ctypes.data, b.ctypes.data} <= _kernel_pointers(engine, x, b)
    assert_close(engine.infer(x, b)[0], ort_run(model, {"x": x, "b": b})[0])


@pytest.mark.parametrize("make,shape", [(_gated_model, (4, 32)), (lambda: loop_model(early_exit=False), (3, 4))],
                         ids=["if", "loop"])
def test_branches_and_loop_bodies_read_inputs_in_place(tmp_path: Path, make, shape) -> None:
    """The kernels of If branches and of Loop bodies (functions given the caller's tensors) read them at any
    element address too (the loop's batch dynamic)."""
    onnx_model = make()
    engine = Engine(_compile(onnx_model, tmp_path, 3, {"x": ["N", 4]} if shape == (3, 4) else None))
    for sign in (1.0, -1.0):
        x = _misaligned(np.abs(np.random.default_rng(1).standard_normal(shape).astype(np.float32)) * sign)
        assert x.ctypes.data % 64
        for got, want in zip(engine.infer(x), ort_run(onnx_model, {"x": x})):
            assert_close(got, want)


def test_read_only_and_strided_inputs_are_copied(tmp_path: Path) -> None:
    """DLPack cannot export a read-only array (a memory-mapped ``np.load(..., mmap_mode="r")``): it is copied,
    aligned or not, as a non-contiguous one is; before, an aligned read-only array failed in DLPack."""
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F32, [8, 16])],
                   [helper.make_tensor_value_info("y", F32, None)], [])
    engine = Engine(_compile(model, tmp_path, 3))
    base = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    aligned = np.empty(8 * 16 + 16, np.float32)
    aligned = aligned[(-aligned.ctypes.data) % 64 // 4:][:128].reshape(8, 16)
    aligned[...] = base
    for x in (aligned, _misaligned(base)):
        x.flags.writeable = False
        np.testing.assert_array_equal(engine.infer(x)[0], np.maximum(base, 0))
    wide = np.repeat(base, 2, axis=1)[:, ::2]
    np.testing.assert_array_equal(engine.infer(wide)[0], np.maximum(base, 0))


def test_an_artifact_without_io_metadata_gets_copies_both_ways(tmp_path: Path) -> None:
    """Artifacts built before ``build.io``: inputs copied to 64-byte aligned buffers, outputs copied."""
    model = _aliasing_model()
    out = _compile(model, tmp_path, 3)
    meta = json.loads((out / "metadata.json").read_text())
    del meta["build"]["io"]
    (out / "metadata.json").write_text(json.dumps(meta))
    engine = Engine(out)
    x = _misaligned(np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32))
    assert x.ctypes.data not in _kernel_pointers(engine, x)
    outputs = engine.infer(x)
    assert all(o.flags.owndata for o in outputs)
    for got, want in zip(outputs, ort_run(model, {"x": x})):
        assert_close(got, want)


def test_an_output_numpy_imports_read_only_is_copied() -> None:
    """numpy before 2.2.5 imports every DLPack tensor read-only (and any numpy, an unversioned capsule): the
    caller still gets an array it can write to."""
    from forgekit.runtime.transfer import hand_over

    source = np.arange(6, dtype=np.float32)

    class Unversioned:  # a producer that speaks DLPack 0.x only
        def __dlpack__(self, **_kwargs):
            return source.__dlpack__()

        def __dlpack_device__(self):
            return source.__dlpack_device__()

    assert not np.from_dlpack(Unversioned()).flags.writeable
    got = hand_over(Unversioned())
    got[0] = 7.0
    assert source[0] == 0.0 and got.flags.writeable


def test_an_engine_shared_by_two_threads_gives_each_its_results(tmp_path: Path) -> None:
    """TVM's Relax VM keeps its frames in the VM object: two threads calling one Engine got each other's
    registers ("Check failed: reg < frame->register_file.size()"), wrong outputs, or a segfault.  Calls now run
    one at a time, and every thread gets its own inputs' results, kept ones unchanged."""
    import threading

    model = _aliasing_model()
    engine = Engine(_compile(model, tmp_path, 3))
    feeds = [_misaligned(np.random.default_rng(k).standard_normal((4, 16)).astype(np.float32)) for k in range(2)]
    wants = [ort_run(model, {"x": f.copy()}) for f in feeds]
    errors: list[str] = []
    start = threading.Barrier(2)

    def worker(t: int) -> None:
        start.wait()
        kept = []
        for _ in range(800):
            try:
                got = engine.infer(feeds[t])
            except Exception as exc:  # noqa: BLE001 - reported below with the thread
                errors.append(f"thread {t}: {exc}")
                return
            errors.extend(f"thread {t}: wrong" for g, w in zip(got, wants[t]) if not np.allclose(g, w))
            kept.append(got)
        errors.extend(f"thread {t}: changed" for got in kept for g, w in zip(got, wants[t]) if not np.allclose(g, w))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def test_a_zero_size_input(tmp_path: Path) -> None:
    """numpy gives a zero-size array zero strides, which the kernels refused ("expected to be compact
    array"): a static [0, 4] input now runs and gives a [0, 4] output."""
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F32, [0, 4])],
                   [helper.make_tensor_value_info("y", F32, None)], [])
    engine = Engine(_compile(model, tmp_path, 3))
    assert np.zeros((0, 4), np.float32).strides == (0, 0)
    assert engine.infer(np.zeros((0, 4), np.float32))[0].shape == (0, 4)
