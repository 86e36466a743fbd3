"""``forgekit.ONNXModule``: Forge's ONNX-level module — introspection, calibrate, quantize to explicit Q/DQ, export.

Forge's ONNX backend (``forge.ONNXModule(path)``) quantizes at the ONNX level for TensorRT
(``export(..., is_tensorrt=True)``).  Here ``quantize`` writes an explicit-quantization ONNX model
(:mod:`forgekit.offload.qdq`: symmetric int8 Q/DQ, per-channel weights), the input TensorRT 10+/11, TI's TIDL
(``prequantized_model``) and onnxruntime take, and ``validate`` measures it against the fp32 model in
onnxruntime.  ``compile(target="tensorrt")`` builds a TensorRT engine from it when the ``tensorrt`` package
imports (strongly typed network: TensorRT 11 has no other int8 mode); any other target goes through
forgekit's own importer and compiler like :func:`forgekit.from_onnx`.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import NotAvailableError, UsageError
from ..offload import qdq


class ONNXModule:
    """An ONNX model held as ONNX (no import into TVM until :meth:`compile` needs it)."""

    def __init__(self, onnx_model: Any, shape_dict: dict[str, Sequence[int | str]] | None = None) -> None:
        from ..importer.load import load_onnx

        self.model, self.path = load_onnx(onnx_model)
        self.shape_dict = {k: list(v) for k, v in (shape_dict or {}).items()}
        self.float_model = self.model
        self._samples: list[dict[str, np.ndarray]] = []
        self.quantization: dict[str, Any] | None = None

    # ------------------------------------------------------------------ introspection
    def _inputs(self) -> list[Any]:
        from ..description import TensorInfo
        from ..importer.load import graph_inputs

        return [TensorInfo(i.name, tuple(self.shape_dict.get(i.name, i.shape)), i.dtype)
                for i in graph_inputs(self.model)]

    def _outputs(self) -> list[Any]:
        from ..importer.load import graph_outputs

        return graph_outputs(self.model)

    input_nodes = property(_inputs)
    output_nodes = property(_outputs)
    input_count = property(lambda self: len(self._inputs()))
    input_names = property(lambda self: [i.name for i in self._inputs()])
    input_shapes = property(lambda self: [i.shape for i in self._inputs()])
    input_dtypes = property(lambda self: [i.dtype for i in self._inputs()])
    output_count = property(lambda self: len(self._outputs()))
    output_names = property(lambda self: [o.name for o in self._outputs()])
    output_shapes = property(lambda self: [o.shape for o in self._outputs()])
    opset = property(lambda self: max((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")),
                                      default=0))

    @property
    def operators(self) -> dict[str, int]:
        """ONNX operator histogram, most frequent first."""
        return dict(collections.Counter(n.op_type for n in self.model.graph.node).most_common())

    is_calibrated = property(lambda self: bool(self._samples))
    is_quantized = property(lambda self: self.quantization is not None)

    def __repr__(self) -> str:
        ins = ", ".join(f"{i.name}{list(i.shape)}:{i.dtype}" for i in self._inputs())
        return f"<forgekit.ONNXModule inputs=[{ins}] nodes={len(self.model.graph.node)} opset={self.opset}>"

    # ------------------------------------------------------------------ quantization
    def calibrate(self, dataset: Any, use_cuda: bool = False) -> ONNXModule:
        """Keep calibration samples: arrays, tuples, ``{input: array}`` dicts, or a ``.npy``/``.npz``/folder path
        (the same forms as :meth:`forgekit.IRModule.calibrate`).  ``use_cuda`` is accepted for Forge."""
        self._samples = self._feeds(dataset)
        return self

    def quantize(self, activation_dtype: str = "int8", kernel_dtype: str | None = None, bias_dtype: str | None = None,
                 per_channel: bool = True, calib_method: str = "minmax", quant_type: str = "static",
                 nodes_to_exclude: Sequence[str] = (), op_types: Sequence[str] | None = qdq.WEIGHTED,
                 min_cosine: float | None = None, validation: Any = None) -> ONNXModule:
        """Replace the model by its explicit-quantization (Q/DQ) form; returns ``self``.

        Activations int8 symmetric (zero point 0; ``uint8``: asymmetric, not for TensorRT), weights int8
        symmetric per output channel (``per_channel=False``: per tensor), biases left to onnxruntime's
        rule (int32 with scale = input scale x weight scale).  ``calib_method``: minmax, average, entropy or
        percentile.  Static only: an explicit-quantization model carries its activation scales.  Q/DQ goes on
        the layers of ``op_types`` (default: those with weights; None: every operator onnxruntime quantizes).
        ``min_cosine``: keep the layers that cost most in float until the output cosine against fp32 on
        ``validation`` (default: the calibration samples) reaches it."""
        if kernel_dtype not in (None, "int8") or bias_dtype not in (None, "int32"):
            raise UsageError("QDQ export writes int8 weights and int32 biases (kernel_dtype='int8', bias_dtype='int32').")
        if quant_type not in ("static", "any"):
            raise UsageError("An explicit-quantization ONNX model is static (its activation scales are in it): "
                             "use quant_type='static'.")
        if self.is_quantized:
            raise UsageError("This module is already quantized (float_model holds the fp32 one).")
        check = None if validation is None else self._feeds(validation)
        self.model, kept = qdq.quantize_qdq(self.float_model, self._samples, per_channel=per_channel,
                                            calib_method=calib_method, activation_dtype=activation_dtype,
                                            nodes_to_exclude=nodes_to_exclude, op_types=op_types,
                                            min_cosine=min_cosine, validation=check)
        self.quantization = {"format": "QDQ", "activation_dtype": activation_dtype, "per_channel": per_channel,
                             "calib_method": calib_method, "samples": len(self._samples),
                             "op_types": list(op_types) if op_types else "all", "float_layers": kept,
                             **qdq.summary(self.model)}
        return self

    def validate(self, samples: Any = None) -> dict[str, float]:
        """Cosine similarity of each output of the quantized model with the fp32 model, in onnxruntime, on
        ``samples`` (default: the calibration samples)."""
        if not self.is_quantized:
            raise UsageError("Nothing to validate: call quantize() first.")
        return qdq.compare(self.float_model, self.model, self._samples if samples is None else self._feeds(samples))

    def _feeds(self, data: Any) -> list[dict[str, np.ndarray]]:
        from ..quantize.samples import iterate

        names = self.input_names
        return [dict(zip(names, s)) for s in iterate(data, names, self.input_shapes, self.input_dtypes)]

    def export(self, path: str | Path, is_tensorrt: bool = True) -> Path:
        """Write the model (Q/DQ after :meth:`quantize`).  ``is_tensorrt`` refuses a model TensorRT's GPU
        layers would reject (non-zero activation zero points: uint8 Q/DQ is DLA-only)."""
        import onnx

        if is_tensorrt and self.quantization and self.quantization["nonzero_zero_points"]:
            raise UsageError("This Q/DQ model has non-zero zero points (uint8 activations), which TensorRT on a GPU "
                             "does not take: quantize with activation_dtype='int8', or export(is_tensorrt=False).")
        path = Path(path)
        onnx.save(self.model, path)
        return path

    # ------------------------------------------------------------------ compile
    def compile(self, target: Any = None, output_path: Any = "compile_output", **kwargs: Any) -> Any:
        """``target="tensorrt"`` builds a TensorRT engine (``model.plan``) when the ``tensorrt`` package imports;
        any other target imports the model and compiles it like :meth:`forgekit.IRModule.compile`."""
        if isinstance(target, str) and target.split()[0].split("/")[0] == "tensorrt":
            return build_tensorrt_engine(self.model, Path(output_path), self.shape_dict)
        from .facade import from_onnx

        options = {} if target is None else {"target": target}
        return from_onnx(self.model, self.shape_dict or None).compile(output_path=output_path, **options, **kwargs)


def build_tensorrt_engine(model: Any, folder: Path, shape_dict: dict[str, list[Any]]) -> Path:
    """A serialized TensorRT engine of ``model`` in ``folder/model.plan`` (strongly typed network: the Q/DQ
    nodes set the int8 layers).  Needs the ``tensorrt`` package and a GPU; forgekit has never run this path
    (TensorRT cannot be installed on the machines it is developed on: docs/offload.md)."""
    try:
        import tensorrt as trt  # type: ignore[import-not-found]
    except ImportError:
        raise NotAvailableError("TensorRT is not installed here (import tensorrt failed): a TensorRT engine needs "
                                "NVIDIA's tensorrt package and a GPU; export the Q/DQ model with export() and build "
                                "it with trtexec --onnx on the GPU machine.") from None
    import onnx

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise NotAvailableError(f"TensorRT's ONNX parser refused the model: {errors}")
    config = builder.create_builder_config()
    if shape_dict:
        profile = builder.create_optimization_profile()
        for name, shape in shape_dict.items():
            profile.set_shape(name, shape, shape, shape)
        config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise NotAvailableError("TensorRT could not build an engine for this model (see its log above).")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.plan").write_bytes(bytes(plan))
    onnx.save(model, folder / "model.onnx")
    return folder / "model.plan"
