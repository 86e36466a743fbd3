"""Explicit quantization: an fp32 ONNX model -> the same model with symmetric int8 Q/DQ pairs, checked in onnxruntime.

This is the int8 input every accelerator flow takes now: TensorRT 10+ (11 removed implicit int8 and its
calibrators: int8 is Q/DQ with zero point 0 in the network), TI's TIDL (``advanced_options:prequantized_model``
reads the scales from Q/DQ nodes) and onnxruntime.  onnxruntime's ``quantize_static`` already writes exactly
this (``QuantFormat.QDQ``, ``QInt8`` activations with ``ActivationSymmetric``, per-channel symmetric int8
weights, MinMax/Entropy/Percentile calibration, Q/DQ placement that its own QDQ fusions and TensorRT's
parser both read), so it is used rather than rewritten; it is the ``forgekit[qdq]`` extra because forgekit's
own int8 path (:mod:`forgekit.quantize`) and every artifact stay free of onnxruntime.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ToolchainError, UsageError

#: forgekit's calibration method names -> onnxruntime's (``average``: a moving average of per-batch min/max,
#: Forge's default)
METHODS = ("minmax", "average", "entropy", "percentile")


def _ort_quantization() -> Any:
    try:
        from onnxruntime import quantization
    except ImportError:
        raise ToolchainError("QDQ export needs onnxruntime's quantization tool: pip install 'forgekit[qdq]' "
                             "(onnxruntime; used at export time only, never by an artifact).") from None
    return quantization


#: where Q/DQ goes by default: the inputs and weights of the layers with weights.  NVIDIA's placement for
#: TensorRT (its quantization toolkits quantize Conv/Linear inputs and weights and leave elementwise layers
#: to follow); on PP-OCRv4 det, Q/DQ on every Add/Mul/Clip of its hardswish blocks cost 0.02 of output cosine
#: beyond this (0.962 against 0.985, minmax, 8 calibration images)
WEIGHTED = ("Conv", "ConvTranspose", "MatMul", "Gemm")


class QdqQuantizer:
    """One model prepared and calibrated once, quantized as often as asked (each with other layers kept in
    float): onnxruntime's calibration cache makes the later runs skip calibration."""

    def __init__(self, model: Any, samples: Sequence[dict[str, np.ndarray]], *, per_channel: bool = True,
                 calib_method: str = "minmax", activation_dtype: str = "int8",
                 op_types: Sequence[str] | None = WEIGHTED) -> None:
        import onnx

        self.q = _ort_quantization()
        if calib_method not in METHODS:
            raise UsageError(f"Unknown calibration method '{calib_method}': choose from {', '.join(METHODS)}.")
        if activation_dtype not in ("int8", "uint8"):
            raise UsageError(f"QDQ activations are int8 or uint8, not '{activation_dtype}'.")
        if not samples:
            raise UsageError("QDQ export needs calibration samples: call calibrate(data) first.")
        self.samples, self.per_channel, self.op_types = list(samples), per_channel, op_types
        self.symmetric = activation_dtype == "int8"
        self.method = {"minmax": self.q.CalibrationMethod.MinMax, "average": self.q.CalibrationMethod.MinMax,
                       "entropy": self.q.CalibrationMethod.Entropy,
                       "percentile": self.q.CalibrationMethod.Percentile}[calib_method]
        self.extra = {"ActivationSymmetric": self.symmetric, "WeightSymmetric": True,
                      "CalibMovingAverage": calib_method == "average"}
        self._tmp = tempfile.TemporaryDirectory(prefix="forgekit-qdq-")
        folder = Path(self._tmp.name)
        self.source, self.prepared, self.cache = folder / "float.onnx", folder / "prepared.onnx", folder / "ranges.json"
        # a path, not the ModelProto: given a ModelProto, quantize_static moves its weights to external data
        # files in its own temporary folder and leaves the caller's proto pointing at them
        onnx.save(_constants_as_initializers(_at_least_opset_13(model)), self.source)
        # onnxruntime's own preparation: shape inference, then its basic graph optimizations (BatchNorm folds
        # into Conv, constants fold)
        from onnxruntime.quantization.shape_inference import quant_pre_process

        with _quiet():
            quant_pre_process(self.source, self.prepared, skip_symbolic_shape=True)
        self.candidates = [n.name for n in onnx.load(self.prepared).graph.node
                           if op_types is None or n.op_type in op_types]

    def run(self, keep_float: Sequence[str] = ()) -> Any:
        """The Q/DQ model with the nodes ``keep_float`` left in float."""
        import onnx

        q = self.q
        rest = iter(self.samples)

        class Reader(q.CalibrationDataReader):  # type: ignore[misc,name-defined]
            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(rest, None)

        out = Path(self._tmp.name) / "qdq.onnx"
        with _quiet():
            q.quantize_static(self.prepared, out, Reader(), quant_format=q.QuantFormat.QDQ, per_channel=self.per_channel,
                              activation_type=q.QuantType.QInt8 if self.symmetric else q.QuantType.QUInt8,
                              weight_type=q.QuantType.QInt8, calibrate_method=self.method,
                              nodes_to_exclude=list(keep_float) or None,
                              op_types_to_quantize=list(self.op_types) if self.op_types else None,
                              extra_options=self.extra, calibration_cache_path=self.cache)
        return onnx.load(out)

    def close(self) -> None:
        self._tmp.cleanup()


def quantize_qdq(model: Any, samples: Sequence[dict[str, np.ndarray]], *, per_channel: bool = True,
                 calib_method: str = "minmax", activation_dtype: str = "int8", nodes_to_exclude: Sequence[str] = (),
                 op_types: Sequence[str] | None = WEIGHTED, min_cosine: float | None = None,
                 validation: Sequence[dict[str, np.ndarray]] | None = None,
                 max_float_layers: int = 16) -> tuple[Any, list[str]]:
    """``model`` (ModelProto) with Q/DQ pairs: int8 symmetric activations (zero point 0), int8 symmetric
    weights (per output channel with ``per_channel``), calibrated on ``samples`` (``{input name: array}``),
    on the layers of ``op_types`` (None: every operator onnxruntime quantizes).  Returns (model, the layers
    left in float).

    ``min_cosine``: when the whole model misses it on ``validation`` (default: the calibration samples),
    measure each layer's cost (the output cosine with that layer alone quantized) and keep the costliest in
    float, 1, 2, 4, ... up to ``max_float_layers``, until it is met (forgekit's ``--max-accuracy-drop`` does
    the same for its own int8).  ``activation_dtype="uint8"`` gives asymmetric uint8 activations
    (onnxruntime's CPU preference on x86 without VNNI); TensorRT on GPUs takes int8 with zero point 0 only."""
    quantizer = QdqQuantizer(model, samples, per_channel=per_channel, calib_method=calib_method,
                             activation_dtype=activation_dtype, op_types=op_types)
    try:
        keep = list(nodes_to_exclude)
        result = quantizer.run(keep)
        if min_cosine is None:
            return result, keep
        check = list(validation or samples)
        if min(compare(model, result, check).values()) >= min_cosine:
            return result, keep
        costs = []
        for name in quantizer.candidates:
            if name in keep:
                continue
            alone = quantizer.run([c for c in quantizer.candidates if c != name])
            costs.append((min(compare(model, alone, check).values()), name))
        ranked = [name for _, name in sorted(costs)]
        count = 1
        while count <= min(max_float_layers, len(ranked)):
            trial = keep + ranked[:count]
            result = quantizer.run(trial)
            if min(compare(model, result, check).values()) >= min_cosine:
                return result, trial
            count *= 2
        raise UsageError(f"The Q/DQ model misses cosine {min_cosine} even with its {min(max_float_layers, len(ranked))} "
                         "most sensitive layers in float: lower min_cosine, raise max_float_layers or calibrate "
                         "on more representative data.")
    finally:
        quantizer.close()


def _constants_as_initializers(model: Any) -> Any:
    """Top-level ``Constant`` nodes holding a tensor become initializers.  PaddlePaddle's exporter writes
    every weight as a Constant node, and onnxruntime's optimizer folds a BatchNorm into its Conv only when
    the parameters are initializers (PP-OCRv4 det kept 2 of its 3 BatchNorms unfolded, each a per-tensor
    quantized Conv output rescaled channel by channel).  onnxoptimizer's ``extract_constant_to_initializer``
    does this too: one more dependency for twenty lines."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = []
    for node in out.graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
            out.graph.initializer.append(tensor)
        else:
            keep.append(node)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out


def _at_least_opset_13(model: Any) -> Any:
    """Per-channel Q/DQ (their ``axis`` attribute) needs opset 13; onnxruntime's quantizer writes it into
    older models too, which then fail to load (PP-OCRv4 det is opset 12)."""
    from onnx import version_converter

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return version_converter.convert_version(model, 13) if opset < 13 else model


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime's quantization tool logs advice on the root logger ("consider pre-processing", which we do)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # and prints calibration progress
            yield
    finally:
        root.setLevel(level)


def summary(model: Any) -> dict[str, Any]:
    """What an explicit-quantization consumer checks: Q/DQ counts, int8 weights with one scale per channel,
    zero points that are not 0, zero-point dtypes."""
    from onnx import numpy_helper

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ops = [n.op_type for n in model.graph.node]
    per_channel, nonzero_zp, dtypes = 0, 0, set()
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        data, scale = inits.get(node.input[0]), inits.get(node.input[1])
        if node.op_type == "DequantizeLinear" and data is not None and data.dtype == np.int8 and scale is not None:
            per_channel += int(scale.size > 1)
        if len(node.input) > 2 and node.input[2] in inits:
            zp = inits[node.input[2]]
            dtypes.add(str(zp.dtype))
            nonzero_zp += int(np.any(zp != 0))
    return {"quantize_linear": ops.count("QuantizeLinear"), "dequantize_linear": ops.count("DequantizeLinear"),
            "per_channel_weights": per_channel, "nonzero_zero_points": nonzero_zp, "dtypes": sorted(dtypes)}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    denom = float(np.linalg.norm(a64) * np.linalg.norm(b64))
    return float(a64 @ b64 / denom) if denom else float(np.array_equal(a64, b64))


def compare(reference: Any, quantized: Any, samples: Sequence[dict[str, np.ndarray]]) -> dict[str, float]:
    """Cosine similarity of each output of ``quantized`` with ``reference`` in onnxruntime (all samples
    concatenated per output)."""
    import onnxruntime as ort

    def session(model: Any) -> Any:
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    ref, qdq = session(reference), session(quantized)
    names = [o.name for o in ref.get_outputs()]
    got: dict[str, list[np.ndarray]] = {n: [] for n in names}
    want: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for feeds in samples:
        for n, r, g in zip(names, ref.run(None, feeds), qdq.run(None, feeds)):
            want[n].append(r.ravel())
            got[n].append(g.ravel())
    return {n: cosine(np.concatenate(got[n]), np.concatenate(want[n])) for n in names}
