"""onnxruntime as the reference: one session setup, one way to match an artifact's inputs to the model's.

onnxruntime is a test/benchmark dependency of forgekit, never a runtime one: a missing onnxruntime is a
one-line NotAvailableError.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import InputError, ModelLoadError, NotAvailableError
from ..log import first_line


#: onnxruntime's x86 u8s8 kernels on CPUs without VNNI (AVX2, AVX-512F) multiply with ``vpmaddubsw``, whose
#: int16 pair sums saturate: its int8 outputs are then off by whole quantization steps (a QDQ CNN on this Zen 3
#: host: 7.7e-3 from onnx.reference's exact result, which forgekit's integer kernels match bit for bit).  This
#: option makes onnxruntime widen to int16 first (its PR #12088); it costs onnxruntime speed, so the timed
#: peer in ``forgekit bench`` runs without it and only the outputs it is judged against use it.
EXACT_INT8 = {"session.x64quantprecision": "1"}


def session(onnx_model: str | os.PathLike[str], threads: int = 1, *, exact: bool = True,
            optimized: bool = True, initializers: Mapping[str, np.ndarray] | None = None) -> Any:
    """An onnxruntime CPU session on ``onnx_model`` with ``threads`` intra-op threads (1: deterministic);
    ``exact``: int8 products without onnxruntime's saturating x86 path (see :data:`EXACT_INT8`), for a
    reference to judge outputs by rather than a peer to time; ``optimized=False``: the graph as written, no
    fusions (what :func:`noise_floor` compares the reference with); ``initializers``: values that replace the
    model's initializers of those names (onnxruntime's ``add_initializer``: the model file is not rewritten)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise NotAvailableError("onnxruntime is not installed: pip install onnxruntime (the reference).") from None
    if not Path(onnx_model).is_file():
        raise ModelLoadError(f"ONNX model '{onnx_model}' does not exist.")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # 4: fatal only.  Its warnings are not the user's business, and its errors reach us as exceptions that
    # become one line; at 3 a failing node also printed its own colored log line to stderr first
    options.log_severity_level = 4
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for key, value in (EXACT_INT8.items() if exact else ()):
        options.add_session_config_entry(key, value)
    # an OrtValue reads the numpy array's memory, which must outlive the session: it holds them (a session
    # whose arrays were freed crashed onnxruntime, exit 139)
    held = [(array, ort.OrtValue.ortvalue_from_numpy(array)) for array in (initializers or {}).values()]
    for name, (_array, value) in zip(initializers or {}, held):
        options.add_initializer(name, value)
    try:
        sess = ort.InferenceSession(str(onnx_model), options, providers=["CPUExecutionProvider"])
        sess.forgekit_initializers = held
        return sess
    except Exception as exc:  # onnxruntime raises its own exception types
        raise ModelLoadError(f"onnxruntime cannot load '{onnx_model}': {first_line(str(exc))}") from None


def feeds(sess: Any, names: Sequence[str], arrays: Sequence[np.ndarray], model: str = "the ONNX model",
          frozen: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The artifact's inputs as the model's feeds: by name when the names agree, else by position when the
    counts agree; otherwise a one-line InputError (the ONNX model is not the one the artifact came from).
    ``frozen`` (metadata ``model.frozen``): the values of inputs the artifact was compiled with ``--freeze``,
    which the ONNX model still takes."""
    ort_inputs = sess.get_inputs()
    ort_names = [i.name for i in ort_inputs]
    frozen = {k: v for k, v in (frozen or {}).items() if k in ort_names and k not in names}
    if set(names) | set(frozen) == set(ort_names):
        chosen = {**dict(zip(names, arrays)), **{spec.name: _frozen_feed(spec, frozen[spec.name])
                                                 for spec in ort_inputs if spec.name in frozen}}
    elif len(ort_names) == len(arrays) and not names:
        chosen = dict(zip(ort_names, arrays))
    else:
        missing = [n for n in ort_names if n not in names and n not in frozen]
        hint = (f" (if the artifact was compiled with --freeze {missing[0]}=..., recompile it: it predates "
                "metadata.json's record of frozen values)" if missing and set(names) < set(ort_names) else "")
        raise InputError(f"{model} has inputs {ort_names} but the artifact has {list(names)}: give the model the "
                         f"artifact was compiled from{hint}.")
    chosen = {name: chosen[name] for name in ort_names}  # the model's order (peers take them by position)
    for spec in ort_inputs:  # same rank and static dims, or it is another model
        array = np.asarray(chosen[spec.name])
        dims = spec.shape or []
        if len(dims) != array.ndim or any(isinstance(d, int) and d != s for d, s in zip(dims, array.shape)):
            raise InputError(f"{model} expects input '{spec.name}' of shape {dims} but the artifact's is "
                             f"{list(array.shape)}: give the model the artifact was compiled from (--onnx).")
    return chosen


def _frozen_feed(spec: Any, value: Any) -> np.ndarray:
    """A frozen value as onnxruntime takes the input: its dtype (``tensor(float)``...), and a single value
    shaped to the input's rank (as ``--freeze`` made it: :func:`forgekit.importer.prepare_onnx`)."""
    kind = str(spec.type)[len("tensor("):-1]
    array = np.asarray(value, dtype={"float": np.float32, "double": np.float64}.get(kind, kind))
    rank = len(spec.shape or [])
    return array.reshape([1] * rank) if array.ndim != rank and array.size == 1 else array


def run(sess: Any, fed: dict[str, Any], model: str = "the ONNX model") -> list[np.ndarray]:
    """The reference outputs, or a one-line InputError when onnxruntime refuses the feeds."""
    try:
        return [np.asarray(r) for r in sess.run(None, fed)]
    except Exception as exc:  # onnxruntime raises its own exception types for bad feeds
        raise InputError(f"onnxruntime cannot run {model} on the artifact's inputs ({first_line(str(exc))}): is it "
                         "the model the artifact was compiled from?") from None


def noise_floor(onnx_model: str | os.PathLike[str], fed: dict[str, Any], expected: Sequence[np.ndarray]) -> list[float]:
    """Per output, the largest difference between the reference (``expected``, onnxruntime with its graph
    optimizations) and onnxruntime running the graph as written: how far two correct fp32 evaluations of this
    model on these inputs drift apart by summation order alone.

    Outputs that are ill-conditioned for the inputs need it: PP-OCRv4 det on random pixels gives a saturated
    probability map (max 2.1e-5), where onnxruntime disagrees with itself by 1.5e-7 (0.7 %); forgekit and
    OpenVINO f32 differ from it by the same 1.4e-7, which a tolerance relative to the output's largest
    magnitude (2e-9) calls wrong."""
    return _against_plain(onnx_model, fed, expected, _max_abs_difference)


def cosine_noise(onnx_model: str | os.PathLike[str], fed: dict[str, Any], expected: Sequence[np.ndarray]) -> list[float]:
    """Per output, ``1 - cosine`` of the reference with onnxruntime running the graph as written: the cosine
    deficit of two correct fp32 evaluations, which a reduced-precision artifact cannot be asked to beat.

    PP-OCRv4 det on random pixels (a probability map of mean 1.8e-9) gives 0.9975 between those two fp32
    runs and 0.9982 between OpenVINO f32 and onnxruntime, so a cosine bar of 0.999 called a correct bf16
    artifact (0.9965; 0.99997 on a text page) wrong; OpenVINO's own bf16 reaches 0.977 there."""
    from .compare import cosine

    # equal outputs: exactly 0, not the rounding of a @ b / norms
    return _against_plain(onnx_model, fed, expected,
                          lambda a, b: 0.0 if np.array_equal(a, b) else max(0.0, 1.0 - cosine(a, b)))


#: ONNX ops that quantize a tensor with its own range at run time (onnxruntime's dynamic quantization).
RUN_TIME_QUANTIZATION = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeLSTM", "DynamicQuantizeMatMul"})


def quantizes_at_run_time(onnx_model: str | os.PathLike[str]) -> bool:
    """Whether the model (or a subgraph of it) holds an op of :data:`RUN_TIME_QUANTIZATION`."""
    import onnx

    def ops(graph: Any) -> Any:
        for node in graph.node:
            yield node.op_type
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from ops(sub)

    model = onnx.load(str(onnx_model), load_external_data=False)
    return any(op in RUN_TIME_QUANTIZATION for op in ops(model.graph))


def perturbation_noise(onnx_model: str | os.PathLike[str], fed: dict[str, Any],
                       expected: Sequence[np.ndarray]) -> list[float]:
    """Per output, the largest difference between the reference and onnxruntime on the same inputs with every
    float element moved 1, 4 or 16 ulps up or down (at most 2e-6 relative, far below what any input is
    measured to): how much the model's own arithmetic amplifies the last bits of a float.

    A model that quantizes tensors with their own range at run time (:func:`quantizes_at_run_time`) rounds
    values to steps of 1/255 of that range, and a value within an ulp of a rounding boundary goes either way;
    through a chain of such layers one flipped step grows.  ddddocr's dynamically quantized CAPTCHA
    recognizer (21 of them before its LSTM), ten 64x160 inputs: forgekit against onnxruntime 0.085-0.30 (of
    outputs up to 16) with the same decoded text, onnxruntime against itself with its inputs nudged so
    0.15-0.33; one nudge alone gave 0 on 6 of the 10 (no value near a boundary moved).  Moving the inputs,
    not the arithmetic, keeps the measure onnxruntime's own.

    A model fed no float (token ids) has no input to move: its float initializers (scales, norm weights,
    embeddings) move instead.  A quantize_dynamic T5 encoder (traceforge-title-model 0.2.0, flan-t5-small,
    32 DynamicQuantizeLinear), 29 real token ids: onnxruntime against itself with those nudged 0.15-0.21
    (cosine 0.978-0.993), forgekit against onnxruntime 0.23 (0.984), the two first apart in an RMS norm's sum
    over 512 values (its order) and, from there on, by flipped steps; on 11 ids nothing flips (3.6e-7)."""
    floats = [k for k, v in fed.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
    weights = {} if floats else _float_initializers(onnx_model)
    worst = [0.0] * len(expected)
    sess = None if weights else session(onnx_model)  # moved weights need a session per nudge
    for ulps in (1, -1, 4, -4, 16, -16):
        nudged = {**fed, **{k: _nudge(fed[k], ulps) for k in floats}}
        moved_sess = session(onnx_model, initializers={k: _nudge(v, ulps) for k, v in weights.items()}) \
            if weights else sess
        moved = _per_output(run(moved_sess, nudged), expected, _max_abs_difference)
        worst = [max(w, m) for w, m in zip(worst, moved)]
    return worst


def _nudge(array: np.ndarray, ulps: int) -> np.ndarray:
    """``array`` moved ``ulps`` representable floats up (positive) or down."""
    dtype = array.dtype
    for _ in range(abs(ulps)):
        array = np.nextafter(array, dtype.type(np.inf if ulps > 0 else -np.inf))
    return np.asarray(array, dtype)  # a 0-d array stays an array (nextafter returns a numpy scalar)


def _float_initializers(onnx_model: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The main graph's float initializers by name (what :func:`perturbation_noise` moves when no input is a
    float)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_model))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
            if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)}


def fp32_noise(onnx_model: str | os.PathLike[str], fed: dict[str, Any], expected: Sequence[np.ndarray]) -> list[float]:
    """Per output, what a correct fp32 evaluation may differ by: :func:`noise_floor`, and for a model that
    quantizes at run time also :func:`perturbation_noise` (``verify`` and ``bench`` judge by it)."""
    noise = noise_floor(onnx_model, fed, expected)
    if quantizes_at_run_time(onnx_model):  # rounding flips at quantization boundaries
        noise = [max(a, b) for a, b in zip(noise, perturbation_noise(onnx_model, fed, expected))]
    return noise


def _against_plain(onnx_model: str | os.PathLike[str], fed: dict[str, Any], expected: Sequence[np.ndarray],
                   measure: Callable[[np.ndarray, np.ndarray], float]) -> list[float]:
    """``measure(plain, reference)`` per float output of the same shape (0 for the others), ``plain`` from
    onnxruntime running the graph as written: what :func:`noise_floor` and :func:`cosine_noise` compare."""
    return _per_output(run(session(onnx_model, optimized=False), fed), expected, measure)


def _per_output(outputs: Sequence[Any], expected: Sequence[np.ndarray],
                measure: Callable[[np.ndarray, np.ndarray], float]) -> list[float]:
    """``measure(output, reference)`` over the numbers of each float output of the reference's shape (0 for the
    others): mask values are judged apart by compare (-inf - -inf is nan)."""
    from .compare import mask_of

    out = []
    for a, b in zip(outputs, expected):
        a, b = np.asarray(a), np.asarray(b)
        if b.dtype.kind != "f" or a.shape != b.shape:
            out.append(0.0)
            continue
        keep = ~mask_of(b.astype(np.float64))
        out.append(measure(a[keep], b[keep]))
    return out


def _max_abs_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max(initial=0.0))
