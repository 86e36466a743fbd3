"""``forgekit.IRModule``: the façade users hold — a Relax module plus what forgekit knows about it.

It keeps the API of Latent AI's Forge (``forge.RelayModule``) so scripts written against Forge run with
``import forgekit as forge``: introspection properties, ``hash(ir)`` (architecture only),
``ir.fingerprint`` (architecture *and* weights), ``copy``, ``set_batch_size``, ``calibrate``,
``quantize``, ``get_inference_function`` and ``compile``.

The façade holds state only (:class:`_State`); every stage it calls takes a plain ``tvm.IRModule`` and
options and returns plain data, so no stage reaches into it.  Weights live inside the module as Relax
constants: what every later stage wants (folding, quantization, weight pre-packing), and it makes the
module self-contained.
"""

from __future__ import annotations

import collections
import copy as _copy
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from ..description import ModelDescription, TensorInfo
from ..errors import NotAvailableError, UsageError
from ..offload.mixin import PartitionMixin
from ..options import DEFAULT_OUTPUT, CompileOptions
from .graph import const_array, constants, frozen_values, input_values, simplify, tensor_infos, to_tvm
from .quantization import QuantizationMixin


@dataclass
class _State:
    """Everything the façade knows beside the module, each field set in one place."""

    input_names: list[str]
    output_names: list[str]
    #: the ONNX model it came from (re-imported by set_batch_size), None for a wrapped Relax module
    source: Any = None
    options: dict[str, bool] = field(default_factory=dict)
    calibration: Any = None  # forgekit.quantize.Calibration
    #: files read to build it (the model, calibration data): an output folder may never hold them
    inputs_read: list[str] = field(default_factory=list)
    float_mod: Any = None  # the module before quantize()
    quantization: dict[str, Any] | None = None
    quantization_report: dict[str, Any] | None = None
    split: bool = False


class IRModule(QuantizationMixin, PartitionMixin):
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
        Put offloaded partitions (``Codegen`` functions) of ``mod`` back into ``main`` (:meth:`inline_partitions`).
    fold_constants:
        Evaluate constant sub-graphs at import (shape arithmetic, weight reshapes, ``ConstantOfShape``).
    fold_batch_norms:
        Fold inference batch-norms into the preceding convolution's weights and bias.
    """

    def __init__(self, mod: Any, params: dict[str, Any] | None = None, inline_partitions: bool = False,
                 fold_constants: bool = True, fold_batch_norms: bool = True, *,
                 input_names: Sequence[str] | None = None, output_names: Sequence[str] | None = None,
                 source: Any = None) -> None:
        from tvm import relax

        if params:
            mod = relax.transform.BindParams("main", {k: to_tvm(v) for k, v in params.items()})(mod)
        if inline_partitions:
            from ..offload.partition import inline_partitions as inline

            mod = inline(mod)
        self._mod = simplify(mod, fold_constants=fold_constants, fold_batch_norms=fold_batch_norms)
        main = self._mod["main"]
        names = list(input_names) if input_names else [p.name for p in main.params]
        if len(names) != len(main.params):
            raise UsageError(f"{len(names)} input names given for {len(main.params)} model inputs.")
        outs = tensor_infos(main.ret_ty)
        outputs = list(output_names) if output_names and len(output_names) == len(outs) \
            else [f"output_{i}" for i in range(len(outs))]
        self._state = _State(names, outputs, source,
                             {"fold_constants": fold_constants, "fold_batch_norms": fold_batch_norms},
                             inputs_read=[source.path] if source is not None and source.path else [])

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_onnx(cls, model_or_path: Any, shape_dict: dict[str, Sequence[int | str]] | None = None, *,
                  freeze: dict[str, Any] | None = None, dynamic: dict[str, Any] | None = None,
                  fold_constants: bool = True, fold_batch_norms: bool = True) -> IRModule:
        """Import an ONNX model (path, bytes or ``onnx.ModelProto``).

        ``shape_dict`` pins input shapes by name, e.g. ``{"x": [1, 3, 224, 224]}``; a string dim stays
        symbolic, and the artifact serves every size of it.  ``dynamic`` bounds such dims
        (``{"W": "32..2048"}`` or ``{"W": (32, 2048)}``): the runtime refuses sizes outside.  ``freeze``
        turns inputs into constants (``{"sample_rate": 16000}``), so ``If``s and shape computations on them
        fold.  Every unsupported operator is reported at once (:class:`~forgekit.errors.UnsupportedOperatorError`).
        """
        from ..importer.dynamic import parse_ranges
        from ..importer.load import OnnxSource, load_onnx, normalize_shape_dict

        model, path = load_onnx(model_or_path)
        source = OnnxSource(model, normalize_shape_dict(model, shape_dict), path, dict(freeze or {}),
                            parse_ranges(dynamic))
        return cls._from_source(source, fold_constants=fold_constants, fold_batch_norms=fold_batch_norms)

    @classmethod
    def _from_source(cls, source: Any, **options: bool) -> IRModule:
        from ..importer.dynamic import annotate, bound_by_slices
        from ..importer.pipeline import import_source

        imported = import_source(source)
        ir = cls(imported.mod, input_names=[i.name for i in imported.inputs],
                 output_names=[o.name for o in imported.outputs], source=source, **options)
        ir._mod = bound_by_slices(annotate(ir._mod, source.dynamic))
        return ir

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

    def _inputs(self) -> list[tuple[tuple[int | str, ...], str]]:
        return [tensor_infos(p.ty)[0] for p in self._mod["main"].params]

    def _outputs(self) -> list[tuple[tuple[int | str, ...], str]]:
        return tensor_infos(self._mod["main"].ret_ty)

    input_count = property(lambda self: len(self._state.input_names))
    input_names = property(lambda self: list(self._state.input_names),
                           doc="Input names as in the ONNX file (TVM's sanitised names are internal).")
    input_shapes = property(lambda self: [s for s, _ in self._inputs()],
                            doc='Input shapes; symbolic dims are their names, e.g. ``("N", 3, 224, 224)``.')
    input_dtypes = property(lambda self: [d for _, d in self._inputs()])
    output_count = property(lambda self: len(self._state.output_names))
    output_names = property(lambda self: list(self._state.output_names))
    output_shapes = property(lambda self: [s for s, _ in self._outputs()])
    output_dtypes = property(lambda self: [d for _, d in self._outputs()])

    @property
    def input_nodes(self) -> list[TensorInfo]:
        """Inputs as (name, shape, dtype) records."""
        return [TensorInfo(n, *info) for n, info in zip(self.input_names, self._inputs())]

    @property
    def output_nodes(self) -> list[TensorInfo]:
        """Outputs as (name, shape, dtype) records."""
        return [TensorInfo(n, *info) for n, info in zip(self.output_names, self._outputs())]

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The model's weights, as numpy arrays keyed ``const_<i>`` in deterministic graph order."""
        return {f"const_{i}": const_array(c) for i, c in enumerate(constants(self._mod["main"]))}

    @property
    def source_path(self) -> str | None:
        """The ONNX file it was imported from (None when it came from memory)."""
        source = self._state.source
        return source.path if source is not None else None

    @property
    def is_split_tensors(self) -> bool:
        return self._state.split

    @property
    def precision(self) -> str:
        """``int8``/``uint8`` when quantized, else the dtype of the first floating input."""
        if self._state.quantization is not None:
            return str(self._state.quantization["activation_dtype"])
        floats = [d for d in self.input_dtypes if d.startswith(("float", "bfloat"))]
        return floats[0] if floats else "float32"

    def describe_dynamic(self) -> dict[str, dict[str, Any]]:
        """Every dynamic dimension with the sizes it may take: ``{"W": {"min": 32, "max": 2048}}``."""
        from ..importer.dynamic import ranges_of

        return {k: r.to_dict() for k, r in ranges_of(self._mod).items()}

    def describe(self) -> ModelDescription:
        """What an artifact's metadata says about this model (plain data for the compile stage)."""
        import os

        source = self.source_path
        return ModelDescription(tuple(self.input_nodes), tuple(self.output_nodes),
                                os.path.basename(source) if source else None, f"{self.structural_hash():016x}",
                                self.fingerprint, self.precision, self._state.quantization,
                                self._state.quantization_report, self.operators,
                                sum(int(const_array(c).nbytes) for c in constants(self._mod["main"])),
                                self.describe_dynamic(), frozen_values(self._state.source),
                                input_values(self._state.source, self._state.calibration if self.is_quantized else None))

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
        for const in constants(self._mod["main"]):
            array = np.ascontiguousarray(const_array(const))
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(array.tobytes())
        return digest.hexdigest()

    def __hash__(self) -> int:
        return self.structural_hash()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IRModule):
            return NotImplemented
        import tvm_ffi

        return bool(tvm_ffi.structural_equal(self._mod, other._mod)) and self.input_names == other.input_names

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}{list(s)}:{d}" for n, s, d in zip(self.input_names, self.input_shapes, self.input_dtypes))
        return f"<forgekit.IRModule inputs=[{ins}] ops={sum(self.operators.values())} hash={self.structural_hash():x}>"

    def copy(self) -> IRModule:
        """A deep copy: transforming the copy never changes this module."""
        import tvm

        clone = _copy.copy(self)
        clone._mod = tvm.IRModule(dict(self._mod.functions.items()), attrs=self._mod.attrs)
        clone._state = replace(self._state, input_names=list(self._state.input_names),
                               output_names=list(self._state.output_names),
                               source=_copy.deepcopy(self._state.source),
                               calibration=_copy.deepcopy(self._state.calibration),
                               inputs_read=list(self._state.inputs_read))
        return clone

    # ------------------------------------------------------------------ transformations
    def set_batch_size(self, batch_size: int) -> IRModule:
        """Set the leading (batch) dimension of every input to ``batch_size``, in place.

        Works for symbolic batch dims (bound to the value) and for fixed ones (the model is re-imported
        from its ONNX source with the new shapes).  Returns ``self`` for chaining.
        """
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise UsageError(f"Batch size must be a positive integer, got {batch_size!r}.")
        if self.is_quantized:
            raise NotAvailableError("Set the batch size before quantizing: the quantized graph is not re-imported.")
        shapes = self.input_shapes
        source = self._state.source
        if source is not None:
            from ..importer.load import OnnxSource, normalize_shape_dict

            wanted = dict(source.shape_dict)
            for name, shape in zip(self.input_names, shapes):
                if shape:
                    wanted[name] = [batch_size, *shape[1:]]
            new = OnnxSource(source.model, normalize_shape_dict(source.model, wanted, override_batch=True),
                             source.path, dict(source.freeze))
            rebuilt = IRModule._from_source(new, **self._state.options)
            self._mod, self._state.source = rebuilt._mod, new
            return self
        symbolic = {str(s[0]): batch_size for s in shapes if s and isinstance(s[0], str)}
        if any(s and isinstance(s[0], int) and s[0] != batch_size for s in shapes):
            raise NotAvailableError("This module has a fixed batch size and no ONNX source to re-import; "
                                    "import it with IRModule.from_onnx to change the batch size.")
        from tvm import relax

        self._mod = relax.transform.BindSymbolicVars(symbolic)(self._mod) if symbolic else self._mod
        return self

    # ------------------------------------------------------------------ execution
    def get_inference_function(self, target: Any = "llvm", opt_level: int = 3) -> Callable[..., Any]:
        """Compile in memory and return ``f(*arrays)`` → array (one output) or list of arrays.

        Meant for debugging and for checking a transformation against the original; deploy with
        :meth:`compile` and :class:`forgekit.runtime.Engine`.  Inputs are checked like the runtime checks
        them (count, dtype, rank, static dims): one :class:`~forgekit.errors.InputError` line each.
        """
        import tvm
        from tvm import relax

        from ..build import build_executable
        from ..quantize.calibrate import flatten_outputs
        from ..runtime.inputs import check_inputs
        from ..targets import parse_target

        spec = parse_target(target)
        if spec.is_cross or not spec.is_cpu:
            raise UsageError(f"get_inference_function runs on this machine's CPU; '{spec.name}' is not it.")
        if spec.levels:  # a portable target: build only the level an artifact would load on this CPU
            from ..targets.variants import best_here, model_variants

            levels = model_variants(spec, self._state.quantization, self.operators)
            best = best_here(levels)
            spec = levels[best if best is not None else -1].spec
        CompileOptions(opt_level=opt_level)  # validates the level
        vm = relax.VirtualMachine(build_executable(self._buildable(), spec, opt_level=opt_level), tvm.cpu())
        specs = [t.to_dict() for t in self.input_nodes]
        ranges = self.describe_dynamic()
        n_out = self.output_count

        def infer(*arrays: Any) -> Any:
            checked = check_inputs(specs, arrays, ranges)
            result = vm["main"](*[tvm.runtime.tensor(np.asarray(a, order="C")) for a in checked])
            outputs = flatten_outputs(result)
            return outputs[0] if n_out == 1 else outputs

        return infer

    def compile(self, target: Any = None, host: Any = None, output_path: Any = DEFAULT_OUTPUT,
                opt_level: int = 3, set_float16: bool = False, set_bfloat16: bool = False,
                set_channel_layout: str | None = None,
                export_relay: bool = False, export_metadata: bool = False, force_overwrite: bool = False,
                uuid: str | None = None, encrypt_password: str | None = None, tuning_trials: int | None = None,
                records: Any = None, tuning_progress: Any = None, tuning_rpc: Any = None,
                gpu_kernels: str = "auto") -> Any:
        """Compile to a deployable artifact directory; returns a :class:`~forgekit.compiler.CompileResult`.

        ``target``/``host``: anything :func:`forgekit.targets.parse_target` accepts (default
        :data:`forgekit.options.DEFAULT_TARGET`: portable, ``x86-64`` on x86-64 machines).  ``output_path``
        must not exist (or be empty) unless ``force_overwrite``, which only ever replaces a forgekit artifact.  ``opt_level`` 0-4
        (see :mod:`forgekit.passes`); ``set_float16`` computes conv/matmul in fp16 with fp32 accumulation;
        ``set_bfloat16`` in bf16 with fp32 accumulation (x86 targets with AVX512_BF16, opt level 3-4);
        ``set_channel_layout="last"`` converts to NHWC; ``export_relay`` also writes the IR as TVMScript,
        ``export_metadata`` a ``compile_report.json``; ``uuid`` is recorded (random by default);
        ``encrypt_password`` encrypts the library (AES-256-GCM, key file ``modelKey.bin``).
        ``tuning_trials`` measures schedule knobs (0: reuse ``records`` only), on a board with ``tuning_rpc``
        (a :class:`forgekit.devices.rpc.RpcConfig`); ``tuning_progress(done, total, note)`` reports it.
        ``gpu_kernels`` (CUDA targets): ``cudnn``, ``vendor``, ``tvm`` or ``auto``
        (:class:`forgekit.options.GpuKernels`).
        """
        kwargs: dict[str, Any] = {} if target is None else {"target": target}
        options = CompileOptions.from_forge(
            host=host, output_path=output_path, opt_level=opt_level, set_float16=set_float16,
            set_bfloat16=set_bfloat16, set_channel_layout=set_channel_layout, export_relay=export_relay,
            export_metadata=export_metadata, force_overwrite=force_overwrite, uuid=uuid,
            encrypt_password=encrypt_password, tuning_trials=tuning_trials, records=records, tuning_rpc=tuning_rpc,
            gpu_kernels=gpu_kernels, inputs=tuple(self._state.inputs_read), **kwargs)
        return self.compile_with(options, tuning_progress=tuning_progress)

    def compile_with(self, options: CompileOptions, tuning_progress: Any = None) -> Any:
        """:meth:`compile` with a :class:`~forgekit.options.CompileOptions` (what the CLI builds)."""
        from ..compiler import compile_model

        options = replace(options, inputs=tuple(dict.fromkeys([*options.inputs, *self._state.inputs_read])))
        return compile_model(self._buildable(), self.describe(), options, ir_text=lambda: self._mod.script(show_meta=False),
                             tuning_progress=tuning_progress)


#: Forge's name for the same class, so ``import forgekit as forge; forge.RelayModule`` works.
RelayModule = IRModule


def from_onnx(model_or_path: Any, shape_dict: dict[str, Sequence[int | str]] | None = None, **kwargs: Any) -> IRModule:
    """Import an ONNX model into a :class:`IRModule` (see :meth:`IRModule.from_onnx`)."""
    return IRModule.from_onnx(model_or_path, shape_dict, **kwargs)


def compile_model(ir: IRModule, **forge_kwargs: Any) -> Any:
    """``ir.compile(**forge_kwargs)``: Forge's function form."""
    return ir.compile(**forge_kwargs)


