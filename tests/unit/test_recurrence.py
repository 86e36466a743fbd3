"""Recurrent layers as one loop kernel (forgekit/importer/converters/recurrence.py).

Before, an LSTM/GRU/RNN was unrolled per time step: a two-GRU model over 300 frames took 579 s to compile
into 11 MB, and the sequence length had to be pinned.  Now the graph does not grow with the length, which
may stay dynamic, and the results match onnxruntime for every direction, layout and GRU variant the
kernel covers (the rest is still unrolled: tests/unit/test_importer.py RNN_CASES)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import forgekit
from forgekit.options import OPT_LEVELS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run  # noqa: E402
from onnx_models import rnn_model  # noqa: E402

CASES = {
    "lstm": dict(kind="LSTM"),
    "lstm_bidirectional": dict(kind="LSTM", direction="bidirectional"),
    "gru": dict(kind="GRU"),
    "gru_linear_before_reset_reverse": dict(kind="GRU", lbr=1, direction="reverse"),
    "rnn_bidirectional": dict(kind="RNN", direction="bidirectional"),
    "gru_no_bias_no_init": dict(kind="GRU", with_bias=False, with_init=False),
}


def _feeds(model, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        shape = [length if d.dim_param == "T" else d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _kernels(ir) -> list[str]:
    return [gv.name_hint for gv in ir.mod.get_global_vars() if "_loop_" in gv.name_hint]


@pytest.mark.parametrize("case", sorted(CASES))
def test_dynamic_length_matches_onnxruntime(case: str) -> None:
    model = rnn_model(T="T", H=20, **CASES[case])  # H=20: not a multiple of the vector width
    ir = forgekit.from_onnx(model)
    assert _kernels(ir), "the recurrence was unrolled"
    run = ir.get_inference_function("host", opt_level=3)
    for length in (1, 7, 40):
        feeds = _feeds(model, length)
        expected = ort_run(model, feeds)
        got = run(*feeds.values())
        got = got if isinstance(got, list) else [got]
        for g, e in zip(got, expected):
            assert_close(g, e)


@pytest.mark.parametrize("level", OPT_LEVELS)
def test_every_level(level: int) -> None:
    model = rnn_model(kind="GRU", T="T", H=32, lbr=1)
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=level)
    feeds = _feeds(model, 25)
    for g, e in zip(run(*feeds.values()), ort_run(model, feeds)):
        assert_close(g, e)


def test_the_graph_does_not_grow_with_the_length() -> None:
    """300 steps import to the same graph as 10 (one loop kernel), not 30x more kernels."""
    sizes = [len(forgekit.from_onnx(rnn_model(kind="GRU", T=t, H=16)).mod.script()) for t in (10, 300)]
    assert abs(sizes[0] - sizes[1]) < 200, sizes


def test_unsupported_variants_are_still_unrolled() -> None:
    for kwargs in (dict(kind="LSTM", peephole=True), dict(kind="GRU", clip=0.5), dict(kind="LSTM", seq_lens=[3, 5])):
        assert not _kernels(forgekit.from_onnx(rnn_model(**kwargs))), kwargs


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_a_bidirectional_layer_is_one_kernel_whose_directions_run_in_parallel(kind: str) -> None:
    """The two directions are independent: one kernel runs them on two threads (a CRNN's BiLSTM, H=512:
    7.1 ms one after the other, 5.0 ms in parallel), writing ONNX's [T, 2, B, H] layout itself."""
    model = rnn_model(kind=kind, T="T", H=32, direction="bidirectional")
    ir = forgekit.from_onnx(model)
    names = _kernels(ir)
    assert len(names) == 1, names
    assert ir.mod[names[0]].script().count("T.parallel(2)") == 1
    run = ir.get_inference_function("host", opt_level=3)
    for length in (3, 16):
        feeds = _feeds(model, length)
        for g, e in zip(run(*feeds.values()), ort_run(model, feeds)):
            assert_close(g, e)


@pytest.mark.parametrize("kind, lbr, shapes", [
    ("LSTM", 0, {"rt": (2, 2, 32, 64)}),                        # 4H = 128: two 64-column panels
    ("GRU", 0, {"rt": (2, 1, 32, 64), "rh": (2, 2, 32, 16)}),   # R_zr^T 2H = 64, R_h^T H = 32
    ("GRU", 1, {"rt": (2, 6, 32, 16)}),                         # 3H = 96: 16-column panels
    ("RNN", 0, {"rt": (2, 2, 32, 16)}),
])
def test_recurrent_weights_stream_in_column_panels(kind: str, lbr: int, shapes: dict) -> None:
    """Every step reads all the recurrent weights in column panels of 64 (or 16) columns.  Row-major, a
    panel's rows were ``4H * 4`` bytes apart (8 KB for an LSTM at H=512), across pages the prefetchers do not
    follow: a BiLSTM's loop (H=512, 8 steps) took 2.9 ms, 2.2 ms packed.  The kernel takes them packed
    ``[D, cols / c, H, c]``, and the results match."""
    model = rnn_model(kind=kind, T="T", H=32, lbr=lbr, direction="bidirectional")
    ir = forgekit.from_onnx(model)
    [name] = _kernels(ir)
    params = {p.name: tuple(int(v) for v in p.shape) for p in ir.mod[name].params if p.name in shapes}
    assert params == shapes
    run = ir.get_inference_function("host", opt_level=3)
    for length in (3, 16):
        feeds = _feeds(model, length)
        for g, e in zip(run(*feeds.values()), ort_run(model, feeds)):
            assert_close(g, e)


@pytest.mark.parametrize("kind, lbr, hidden", [("LSTM", 0, 256), ("GRU", 0, 256), ("GRU", 1, 256), ("RNN", 0, 384)])
def test_one_direction_splits_each_step_over_the_threads(kind: str, lbr: int, hidden: int) -> None:
    """A one-direction layer with 512 KB or more of recurrent weights splits every step's product over the
    threads: on one thread a unidirectional LSTM at H=512 (4 MB, 40 steps) took 8.0 ms against onnxruntime's
    3.3, split 2.9 (each core's half of the weights stays in its L2).  Smaller ones stay on one thread
    (H=128: a fork and join per step cost more than they save, 0.27 -> 0.31 ms).  The results match."""
    from forgekit.importer.converters.recurrence import splits_steps

    model = rnn_model(kind=kind, T="T", I=8, H=hidden, lbr=lbr, seed=1)
    ir = forgekit.from_onnx(model)
    [name] = _kernels(ir)
    assert name.endswith("_split") and "T.parallel" in ir.mod[name].script()
    assert not splits_steps(kind.lower(), 128)
    run = ir.get_inference_function("host", opt_level=3)
    # few steps: with these weights an RNN of 384 is chaotic, 4.6e-4 from onnxruntime at 6 steps, split or not
    for length in (1, 3):
        feeds = _feeds(model, length)
        for g, e in zip(run(*feeds.values()), ort_run(model, feeds)):
            assert_close(g, e)


def _pool(threads: int) -> int:
    """Resize the calling thread's TVM pool (0: its default); the size it took (at most the cores)."""
    import tvm_ffi

    tvm_ffi.get_global_func("runtime.config_threadpool")(1, threads)
    return tvm_ffi.get_global_func("runtime.NumThreads")()


@pytest.mark.parametrize("kind, lbr, hidden", [("LSTM", 0, 256), ("GRU", 0, 256), ("GRU", 1, 256), ("RNN", 0, 512)])
def test_a_bidirectional_layer_with_large_weights_splits_each_direction_s_steps(kind: str, lbr: int,
                                                                                hidden: int) -> None:
    """With 512 KB or more of recurrent weights per direction, a bidirectional layer runs its directions one
    after the other, each step split over the threads, rather than a direction per thread: each thread then
    streams a share of one direction, which stays in its L2, not all of one.  A BiLSTM at H=512 (40 steps,
    2 threads, a Xeon with 2 MB of L2 per core): 5.93 ms a direction per thread, 2.33 ms now.  The results
    match onnxruntime, and are the same to the bit with 1, 2 or 3 threads in the pool (the split and the
    order of the panels change no sum)."""
    model = rnn_model(kind=kind, T="T", I=8, H=hidden, lbr=lbr, direction="bidirectional", seed=2)
    ir = forgekit.from_onnx(model)
    [name] = _kernels(ir)
    script = ir.mod[name].script()
    assert name.endswith("_split") and "for d in range(2)" in script and "runtime.NumThreads" in script
    run = ir.get_inference_function("host", opt_level=3)
    try:
        for length in (2, 3):  # steps of both parities: the panels in order, then mirrored
            feeds = _feeds(model, length)
            by_pool = []
            for threads in (1, 2, 3):
                _pool(threads)
                by_pool.append(run(*feeds.values()))
            for g, e in zip(by_pool[0], ort_run(model, feeds)):
                assert_close(g, e)
            for other in by_pool[1:]:
                for g, e in zip(other, by_pool[0]):
                    np.testing.assert_array_equal(np.asarray(g), np.asarray(e))
    finally:
        _pool(0)


@pytest.mark.parametrize("panels", [1, 4, 32, 33])
def test_each_thread_visits_its_panels_back_and_forth(panels: int) -> None:
    """A split step visits its column panels in order at even steps and, at odd steps, each thread's share of
    TVM's static split mirrored, so a thread reads first what it read last (cached): the panel index the kernel
    computes (recurrence._snake, with the pool's size read by the kernel itself) is, for every pool size, a
    permutation of the panels that keeps each thread's share.  Cyclic, a share near the L2's size missed on
    every line: the BiLSTM above 3.48 -> 2.33 ms."""
    import tvm

    from forgekit.importer.converters.recurrence import _THREADS, _snake

    src = (f"@T.prim_func\ndef main(out: T.Buffer((2, {panels}), \"int32\")):\n{_THREADS}\n"
           f"    for s in range(T.int64(2)):\n        for jp in T.parallel({panels}):\n"
           f"            out[s, jp] = {_snake('jp', panels)}\n")
    lib = tvm.compile(tvm.IRModule({"main": tvm.script.from_source(src)}), target="llvm")
    try:
        for wanted in (1, 2, 3, 5):
            threads = _pool(wanted)
            out = tvm.runtime.tensor(np.zeros((2, panels), np.int32))
            lib["main"](out)
            even, odd = out.numpy()
            np.testing.assert_array_equal(even, np.arange(panels))
            share = -(-panels // threads)  # codegen_cpu.cc: thread i runs [i * share, (i + 1) * share)
            for first in range(0, panels, share):
                mine = np.arange(first, min(first + share, panels))
                np.testing.assert_array_equal(odd[mine], mine[::-1])
            assert sorted(odd) == list(range(panels))
    finally:
        _pool(0)
