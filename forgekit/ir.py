"""``forgekit.IRModule``: a Relax module plus what forgekit knows about it.

The wrapper keeps the Forge API (``forge.RelayModule``) so scripts written against Latent AI's Forge run
with ``import forgekit as forge``: introspection properties, ``hash(ir)`` (architecture only),
``ir.fingerprint`` (architecture *and* weights), ``copy``, ``set_batch_size``,
``get_inference_function`` and ``compile``.

Weights live inside the module as Relax constants.  That is what every later stage wants (constant
folding, batch-norm folding, quantization, weight pre-packing) and it makes the module self-contained.
"""

from __future__ import annotations

import collections
import copy as _copy
import hashlib
from typing import Any, Callable, Sequence

import numpy as np

from . import frontend
from .errors import CompileError, InputError, NotAvailableError, UsageError
from .frontend import OnnxSource, TensorInfo


def _dim(value: Any) -> int | str:
    try:
        return int(value)
    except (TypeError, ValueError):
        return str(value)


def _tensor_infos(ty: Any) -> list[tuple[tuple[int | str, ...], str]]:
    """(shape, dtype) of every tensor in a Relax type (tuples are flattened)."""
    from tvm import relax

    if isinstance(ty, relax.TupleType):
        return [info for field in ty.fields for info in _tensor_infos(field)]
    shape = getattr(ty, "shape", None)
    dims = tuple(_dim(v) for v in shape.values) if shape is not None and hasattr(shape, "values") else ()
    return [(dims, str(ty.dtype))]


def _const_array(const: Any) -> np.ndarray:
    """Data of a constant: tensors carry a ``tvm.runtime.Tensor``, scalar constants a Python value."""
    value = const.value
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _constants(func: Any) -> list[Any]:
    """Relax constants of ``func`` in a deterministic (post-)order, each once."""
    from tvm import relax
    from tvm.ir.expr import Constant  # TVM 0.27 moved relax.Constant here (data in ``.value``)

    found: list[Any] = []
    seen: set[int] = set()

    def visit(expr: Any) -> None:
        # A constant object can be referenced by several bindings; count its bytes once.
        if isinstance(expr, Constant) and expr.__chandle__() not in seen:
            seen.add(expr.__chandle__())
            found.append(expr)

    relax.analysis.post_order_visit(func, visit)
    return found


class IRModule:
    """A model in forgekit's IR (a Relax ``tvm.IRModule`` with weights as constants).

    Build one with :meth:`from_onnx` (or :func:`forgekit.from_onnx`); the constructor wraps an existing
    Relax module.

    Parameters
    ----------
    mod:
        A Relax ``tvm.IRModule`` whose ``main`` takes the model inputs.
    params:
        Optional weights to bind to parameters of ``main`` by name (as Forge's ``RelayModule`` takes).
    inline_partitions:
        Accepted for Forge compatibility; forgekit has no partitions to inline yet.
    fold_constants:
        Evaluate constant sub-graphs at import (shape arithmetic, weight reshapes, ``ConstantOfShape``).
    fold_batch_norms:
        Fold inference batch-norms into the preceding convolution's weights and bias.
    """

    def __init__(
        self,
        mod: Any,
        params: dict[str, Any] | None = None,
        inline_partitions: bool = False,
        fold_constants: bool = True,
        fold_batch_norms: bool = True,
        *,
        input_names: Sequence[str] | None = None,
        output_names: Sequence[str] | None = None,
        source: OnnxSource | None = None,
    ) -> None:
        from tvm import relax

        if params:
            mod = relax.transform.BindParams("main", {k: _to_tvm(v) for k, v in params.items()})(mod)
        self._options = {"fold_constants": fold_constants, "fold_batch_norms": fold_batch_norms,
                         "inline_partitions": inline_partitions}
        self._mod = _prepare(mod, fold_constants=fold_constants, fold_batch_norms=fold_batch_norms)
        main = self._mod["main"]
        n_in = len(main.params)
        self._input_names = list(input_names) if input_names else [p.name for p in main.params]
        if len(self._input_names) != n_in:
            raise UsageError(f"{len(self._input_names)} input names given for {n_in} model inputs.")
        outs = _tensor_infos(main.ret_ty)
        self._output_names = list(output_names) if output_names and len(output_names) == len(outs) \
            else [f"output_{i}" for i in range(len(outs))]
        self._source = source
        self._calibration: Any = None  # forgekit.quantize.Calibration
        self._quantized = False
        self._split = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_onnx(
        cls,
        model_or_path: Any,
        shape_dict: dict[str, Sequence[int | str]] | None = None,
        *,
        fold_constants: bool = True,
        fold_batch_norms: bool = True,
    ) -> IRModule:
        """Import an ONNX model (path, bytes or ``onnx.ModelProto``).

        ``shape_dict`` pins input shapes by name, e.g. ``{"x": [1, 3, 224, 224]}``; a string dim stays
        symbolic.  Every unsupported operator is reported at once (:class:`UnsupportedOperatorError`).
        """
        model, path = frontend.load_onnx(model_or_path)
        source = OnnxSource(model, frontend.normalize_shape_dict(model, shape_dict), path)
        return cls._from_source(source, fold_constants=fold_constants, fold_batch_norms=fold_batch_norms)

    @classmethod
    def _from_source(cls, source: OnnxSource, **options: bool) -> IRModule:
        mod, inputs, outputs = frontend.to_relax(source)
        return cls(mod, input_names=[i.name for i in inputs], output_names=[o.name for o in outputs],
                   source=source, **options)

    # ------------------------------------------------------------------ introspection
    @property
    def mod(self) -> Any:
        """The Relax ``tvm.IRModule`` (weights are constants inside it)."""
        return self._mod

    @property
    def typed_mod(self) -> Any:
        """The module after type/shape inference (Relax modules are always typed: normalized copy)."""
        from tvm import relax

        return relax.transform.Normalize()(self._mod)

    @property
    def operators(self) -> dict[str, int]:
        """Operator histogram, e.g. ``{"nn.conv2d": 53, "add": 54, ...}``, most frequent first."""
        import tvm
        from tvm import relax

        counts: collections.Counter[str] = collections.Counter()

        def visit(expr: Any) -> None:
            if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
                counts[str(expr.op.name).removeprefix("relax.")] += 1

        for _gv, func in self._mod.functions.items():
            if isinstance(func, relax.Function):
                relax.analysis.post_order_visit(func, visit)
        return dict(counts.most_common())

    @property
    def input_count(self) -> int:
        return len(self._input_names)

    @property
    def input_names(self) -> list[str]:
        """Input names as in the ONNX file (TVM's sanitised names are internal)."""
        return list(self._input_names)

    @property
    def input_shapes(self) -> list[tuple[int | str, ...]]:
        """Input shapes; symbolic dims are their names, e.g. ``("N", 3, 224, 224)``."""
        return [_tensor_infos(p.ty)[0][0] for p in self._mod["main"].params]

    @property
    def input_dtypes(self) -> list[str]:
        return [_tensor_infos(p.ty)[0][1] for p in self._mod["main"].params]

    @property
    def input_nodes(self) -> list[TensorInfo]:
        """Inputs as (name, shape, dtype) records."""
        return [TensorInfo(n, s, d) for n, s, d in zip(self.input_names, self.input_shapes, self.input_dtypes)]

    @property
    def output_count(self) -> int:
        return len(self._output_names)

    @property
    def output_names(self) -> list[str]:
        return list(self._output_names)

    @property
    def output_shapes(self) -> list[tuple[int | str, ...]]:
        return [s for s, _ in _tensor_infos(self._mod["main"].ret_ty)]

    @property
    def output_dtypes(self) -> list[str]:
        return [d for _, d in _tensor_infos(self._mod["main"].ret_ty)]

    @property
    def output_nodes(self) -> list[TensorInfo]:
        return [TensorInfo(n, s, d) for n, s, d in zip(self.output_names, self.output_shapes, self.output_dtypes)]

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The model's weights, as numpy arrays keyed ``const_<i>`` in deterministic graph order."""
        return {f"const_{i}": _const_array(c) for i, c in enumerate(_constants(self._mod["main"]))}

    @property
    def graph_count(self) -> int:
        """Number of Relax functions (graphs) in the module: 1 for a plain model."""
        from tvm import relax

        return sum(1 for _, f in self._mod.functions.items() if isinstance(f, relax.Function))

    @property
    def subgraph_count(self) -> int:
        """Number of sub-graphs offloaded to an external codegen (BYOC); 0 without offload."""
        from tvm import relax

        return sum(1 for _, f in self._mod.functions.items()
                   if isinstance(f, relax.Function) and f.attrs is not None and "Codegen" in f.attrs)

    @property
    def is_calibrated(self) -> bool:
        return self._calibration is not None

    @property
    def is_quantized(self) -> bool:
        return self._quantized

    @property
    def is_tensorrt(self) -> bool:
        """Always False: this TVM build has no TensorRT runtime."""
        return False

    @property
    def is_split_tensors(self) -> bool:
        return self._split

    @property
    def precision(self) -> str:
        """``int8``/``uint8`` when quantized, else the dtype of the first floating input."""
        if self._quantized:
            return str(self._quant_info["activation_dtype"])
        floats = [d for d in self.input_dtypes if d.startswith(("float", "bfloat"))]
        return floats[0] if floats else "float32"

    # ------------------------------------------------------------------ identity
    def structural_hash(self) -> int:
        """Hash of the architecture only: same graph with other weights gives the same value."""
        import tvm_ffi

        return int(tvm_ffi.structural_hash(self._mod, skip_tensor_content=True))

    @property
    def fingerprint(self) -> str:
        """Deterministic SHA-256 (hex) of the structure **and** every weight byte."""
        digest = hashlib.sha256()
        digest.update(f"forgekit-ir-v1:{self.structural_hash():x}".encode())
        for const in _constants(self._mod["main"]):
            array = np.ascontiguousarray(_const_array(const))
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(array.tobytes())
        return digest.hexdigest()

    def __hash__(self) -> int:
        return self.structural_hash()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IRModule):
            return NotImplemented
        import tvm_ffi

        return bool(tvm_ffi.structural_equal(self._mod, other._mod)) and self._input_names == other._input_names

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}{list(s)}:{d}" for n, s, d in zip(self.input_names, self.input_shapes, self.input_dtypes))
        return f"<forgekit.IRModule inputs=[{ins}] ops={sum(self.operators.values())} hash={self.structural_hash():x}>"

    def copy(self) -> IRModule:
        """A deep copy: transforming the copy never changes this module."""
        import tvm

        clone = _copy.copy(self)
        clone._mod = tvm.IRModule(dict(self._mod.functions.items()), attrs=self._mod.attrs)
        clone._input_names = list(self._input_names)
        clone._output_names = list(self._output_names)
        clone._source = _copy.deepcopy(self._source)
        clone._calibration = _copy.deepcopy(self._calibration)
        return clone

    # ------------------------------------------------------------------ transformations
    def set_batch_size(self, batch_size: int) -> IRModule:
        """Set the leading (batch) dimension of every input to ``batch_size``, in place.

        Works for symbolic batch dims (bound to the value) and for fixed ones (the model is re-imported
        from its ONNX source with the new shapes).  Returns ``self`` for chaining.
        """
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise UsageError(f"Batch size must be a positive integer, got {batch_size!r}.")
        if self._quantized:
            raise NotAvailableError("Set the batch size before quantizing: the quantized graph is not re-imported.")
        shapes = self.input_shapes
        if self._source is not None:
            new_dict = dict(self._source.shape_dict)
            for name, shape in zip(self._input_names, shapes):
                if shape:
                    new_dict[name] = [batch_size, *shape[1:]]
            source = OnnxSource(self._source.model, new_dict, self._source.path)
            rebuilt = IRModule._from_source(source, **{k: v for k, v in self._options.items()
                                                       if k != "inline_partitions"})
            self._mod, self._source = rebuilt._mod, source
            return self
        symbolic = {str(s[0]): batch_size for s in shapes if s and isinstance(s[0], str)}
        fixed = [s for s in shapes if s and isinstance(s[0], int) and s[0] != batch_size]
        if fixed:
            raise NotAvailableError("This module has a fixed batch size and no ONNX source to re-import; "
                                    "import it with IRModule.from_onnx to change the batch size.")
        from tvm import relax

        self._mod = relax.transform.BindSymbolicVars(symbolic)(self._mod) if symbolic else self._mod
        return self

    def calibrate(self, calib_data: Any, reset: bool = True, use_cuda: bool = True) -> None:
        """Run the model on ``calib_data`` and record activation statistics for :meth:`quantize`.

        ``calib_data``: an iterable of samples (one array, a tuple of arrays in input order, or a dict
        by input name), a stacked array, or a ``.npy``/``.npz`` file or folder path.  ``reset=False`` adds
        to the statistics of an earlier call.  ``use_cuda`` runs on a CUDA GPU when there is one (CPU
        otherwise, silently).  See :mod:`forgekit.quantize`.
        """
        from . import quantize as q

        if self._quantized:
            raise UsageError("The model is already quantized: calibrate the float model before quantize().")
        previous = None if reset else self._calibration
        self._calibration = q.calibrate(self, calib_data, previous=previous, use_cuda=use_cuda)

    def quantize(self, activation_dtype: str = "int8", kernel_dtype: str | None = None, bias_dtype: str | None = None,
                 per_channel: bool = False, calib_method: str = "average", quant_type: str = "any", *,
                 percentile: float = 99.0, smoothing: float | None = 0.75,
                 max_accuracy_drop: float | None = None, quantize_depthwise: bool = False,
                 bias_correction: bool = True) -> None:
        """Post-training quantization to integer conv2d/matmul (int32 accumulation), in place.

        ``activation_dtype``: ``int8`` (symmetric) or ``uint8`` (asymmetric, with a zero point; where a
        conv pads its input only tensors that are never negative take uint8, the rest symmetric int8).
        Weights are symmetric int8, per output channel with ``per_channel``; ``bias_correction`` (static)
        removes the mean output error of weight rounding using the calibrated input means.
        ``calib_method``: ``average``, ``entropy``, ``minmax`` or ``percentile`` (``percentile``=99).
        ``quant_type``: ``static`` (needs :meth:`calibrate`), ``dynamic`` (activation ranges at run time)
        or ``any`` (static when calibrated).  ``smoothing`` (SmoothQuant's alpha, None to disable)
        balances outlier input channels of matmuls into their weights.  ``max_accuracy_drop`` (e.g. 0.01) keeps the most sensitive
        layers in fp32 until the output agreement on the calibration samples is within the budget; the
        per-layer report is then in :attr:`quantization_report`.  Depthwise convolutions stay fp32 (faster
        and more accurate on this compiler's kernels) unless ``quantize_depthwise``.
        """
        from . import quantize as q

        if self._quantized:
            raise UsageError("The model is already quantized.")
        options = dict(activation_dtype=activation_dtype, kernel_dtype=kernel_dtype, bias_dtype=bias_dtype,
                       per_channel=per_channel, calib_method=calib_method, quant_type=quant_type,
                       percentile=percentile, smoothing=smoothing, quantize_depthwise=quantize_depthwise,
                       bias_correction=bias_correction)
        if max_accuracy_drop is not None:
            from .quantize import report

            mod, info, self._quant_report = report.quantize_within_budget(self, self._calibration, max_accuracy_drop,
                                                                          options)
        else:
            mod, info = q.quantize(self, self._calibration, **options)
        self._float_mod = self._mod
        self._mod, self._quant_info, self._quantized = mod, info, True

    @property
    def quantization(self) -> dict[str, Any] | None:
        """The quantization parameters (dtypes, method, type, per-layer scales), None before :meth:`quantize`."""
        return getattr(self, "_quant_info", None)

    @property
    def quantization_report(self) -> dict[str, Any] | None:
        """Per-layer fp32-vs-quantized agreement from ``quantize(max_accuracy_drop=...)`` or
        :func:`forgekit.quantize.report.accuracy_report`."""
        return getattr(self, "_quant_report", None)

    def split_tensors(self, force: bool = False) -> None:
        """Split large conv weight tensors in two along the output channels (Forge's ``split_tensors``).

        Raises when calibration data exists (the op numbering would no longer match) unless ``force``,
        which drops the calibration.
        """
        from .quantize import split

        if self._calibration is not None and not force:
            raise UsageError("split_tensors would invalidate the calibration data: call it before calibrate(), "
                             "or pass force=True to drop the calibration.")
        if self._quantized:
            raise UsageError("split_tensors must run before quantize().")
        self._mod = split.split_tensors(self._mod)
        self._calibration = None
        self._split = True

    # ------------------------------------------------------------------ execution
    def get_inference_function(self, target: Any = "llvm", opt_level: int = 3) -> Callable[..., Any]:
        """Compile in memory and return ``f(*arrays)`` → array (one output) or list of arrays.

        Meant for debugging and for checking a transformation against the original; deploy with
        :meth:`compile` and :class:`forgekit.runtime.Engine`.
        """
        import tvm
        from tvm import relax

        from .pipeline import build_executable
        from .targets import parse_target

        spec = parse_target(target)
        if spec.is_cross or not spec.is_cpu:
            raise UsageError(f"get_inference_function runs on this machine's CPU; '{spec.name}' is not it.")
        executable = build_executable(self, spec, opt_level=opt_level)
        vm = relax.VirtualMachine(executable, tvm.cpu())
        names, dtypes, n_out = self.input_names, self.input_dtypes, self.output_count

        def infer(*arrays: Any) -> Any:
            if len(arrays) != len(names):
                raise InputError(f"Expected {len(names)} input(s) ({', '.join(names)}), got {len(arrays)}.")
            args = []
            for name, dtype, array in zip(names, dtypes, arrays):
                array = np.asarray(array)
                if str(array.dtype) != dtype:
                    raise InputError(f"Input '{name}' has dtype {array.dtype}; the model expects {dtype}.")
                args.append(tvm.runtime.tensor(np.ascontiguousarray(array)))
            result = vm["main"](*args)
            outputs = _flatten_outputs(result)
            return outputs[0] if n_out == 1 else outputs

        return infer

    def compile(self, target: Any = "llvm", host: Any = None, output_path: Any = "./compile_output",
                opt_level: int = 3, set_float16: bool = False, set_channel_layout: str | None = None,
                export_relay: bool = False, export_metadata: bool = False, force_overwrite: bool = False,
                uuid: str | None = None, encrypt_password: str | None = None, tuning_trials: int | None = None,
                records: Any = None, tuning_progress: Any = None, tuning_rpc: Any = None) -> Any:
        """Compile to a deployable artifact directory; see :func:`forgekit.compiler.compile_model`."""
        from .compiler import compile_model

        return compile_model(self, target=target, host=host, output_path=output_path, opt_level=opt_level,
                             set_float16=set_float16, set_channel_layout=set_channel_layout,
                             export_relay=export_relay, export_metadata=export_metadata,
                             force_overwrite=force_overwrite, uuid=uuid, encrypt_password=encrypt_password,
                             tuning_trials=tuning_trials, records=records, tuning_progress=tuning_progress,
                             tuning_rpc=tuning_rpc)


#: Forge's name for the same class, so ``import forgekit as forge; forge.RelayModule`` works.
RelayModule = IRModule


def from_onnx(model_or_path: Any, shape_dict: dict[str, Sequence[int | str]] | None = None, **kwargs: Any) -> IRModule:
    """Import an ONNX model into a :class:`IRModule` (see :meth:`IRModule.from_onnx`)."""
    return IRModule.from_onnx(model_or_path, shape_dict, **kwargs)


def _to_tvm(value: Any) -> Any:
    import tvm

    return value if hasattr(value, "numpy") else tvm.runtime.tensor(np.asarray(value))


def _flatten_outputs(result: Any) -> list[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [o for item in result for o in _flatten_outputs(item)]


def _prepare(mod: Any, *, fold_constants: bool, fold_batch_norms: bool) -> Any:
    """Constructor-time simplifications (Forge's ``fold_constants`` / ``fold_batch_norms``)."""
    from tvm import relax

    from .pipeline import fold_batch_norms as _fold_bn

    try:
        if fold_constants or fold_batch_norms:
            mod = relax.transform.FoldConstant()(mod)
        if fold_batch_norms:
            mod = _fold_bn(mod)
        return mod
    except Exception as exc:
        raise CompileError(f"Simplifying the imported graph failed: {frontend._first_line(exc)}") from exc
