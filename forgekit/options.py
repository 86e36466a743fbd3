"""The options of each stage: frozen, typed, validated once, every default written once.

The CLI, the Python API (``IRModule.compile(...)`` with Forge's keyword names) and the GitHub Action all
build these objects; stages take them as plain data.  A bad value is a one-line
:class:`~forgekit.errors.UsageError` raised when the object is made, before any work starts.
"""

from __future__ import annotations

import enum
import uuid as _uuid
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from .errors import UsageError
from .runtime.cpu import host_arch

#: the target when none is given, in the CLI, the Python API and the Action alike: the portable target of
#: the compiling machine's architecture (forgekit.targets.variants), so an artifact compiled with the
#: defaults runs on any CPU of that architecture, at its best level: on this Zen 5 the x86-64-v4 level was
#: 0.86-1.03x the latency of a ``host`` build (bench/bench_portable.py), where a ``host`` artifact died with
#: SIGILL on a Haswell.  ``host`` stays one option away, for a single known machine.
DEFAULT_TARGET = {"x86_64": "x86-64", "aarch64": "arm/aarch64"}.get(host_arch(), "host")
DEFAULT_OUTPUT = "./compile_output"
OPT_LEVELS = (0, 1, 2, 3, 4)


class Precision(enum.StrEnum):
    """What a compiled model's convolutions and matmuls compute in (accumulating in fp32): resolved once, in
    :class:`CompileOptions`, from every spelling (``--precision fp16``, ``set_float16=True``, ``"bfloat16"``) and
    read where a stage needs it.  A ``str``: it compares equal to, prints and serializes as its long name.  int8 is
    not one: a quantized model's operators are integer whatever this says (:mod:`forgekit.quantize`)."""

    FP32 = "float32"
    FP16 = "float16"  # ToMixedPrecision (forgekit.passes): CUDA targets, or the same graph built for a CPU
    BF16 = "bfloat16"  # forgekit's CPU kernels on AVX512_BF16 (forgekit.backends.cpu.bf16), opt level 3-4

    @property
    def short(self) -> str:
        """The CLI's spelling: ``fp32``, ``fp16``, ``bf16``."""
        return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[self.value]

    @classmethod
    def parse(cls, value: Any) -> Precision:
        """A :class:`Precision` from a member or any of its spellings, long or short, in any case; a one-line
        :class:`UsageError` naming the long ones otherwise."""
        found = PRECISION_NAMES.get(str(value).lower()) if isinstance(value, str) else None
        if found is None:
            _choice("precision", value, PRECISIONS)
        return found


class GpuKernels(enum.StrEnum):
    """Whose kernels a CUDA build runs: ``cudnn`` (convolutions on NVIDIA's library, compiled into the
    artifact: :mod:`forgekit.backends.cuda.cudnn`), ``vendor`` (also matmuls on cuBLAS:
    :mod:`forgekit.backends.cuda.cublas`, not yet measured on a GPU), ``tvm`` (DLight's schedules, no library
    needed where it runs), or ``auto``: cuDNN when its wheel is installed here (the recorded default, measured
    on an H200 in ``docs/gpu.md``), else TVM's.  CPU builds ignore it."""

    AUTO = "auto"
    TVM = "tvm"
    CUDNN = "cudnn"
    VENDOR = "vendor"

    @classmethod
    def parse(cls, value: Any) -> GpuKernels:
        try:
            return cls(str(value).lower())
        except ValueError:
            raise UsageError(f"Unknown GPU kernels '{value}': use auto, tvm, cudnn or vendor.") from None


PRECISIONS = tuple(p.value for p in Precision)
#: every spelling of each precision (the CLI's --precision fp32|fp16|bf16 and the long names) -> Precision
PRECISION_NAMES = {**{p.short: p for p in Precision}, **{p.value: p for p in Precision}}
#: ``set_channel_layout`` spellings -> "first" (NCHW, what ONNX has) or "last" (NHWC)
LAYOUTS = {"first": "first", "nchw": "first", "last": "last", "nhwc": "last"}
ACTIVATION_DTYPES = ("int8", "uint8")
CALIB_METHODS = ("average", "entropy", "minmax", "percentile")
QUANT_TYPES = ("any", "static", "dynamic")


def normalize_layout(layout: str | None) -> str | None:
    """``first``/``last``/``NCHW``/``NHWC`` (any case) -> ``"first"``/``"last"``; None stays None."""
    if layout is None:
        return None
    try:
        return LAYOUTS[str(layout).lower()]
    except KeyError:
        raise UsageError(f"Unknown channel layout '{layout}': use first, last, NCHW or NHWC.") from None


def _choice(what: str, value: Any, valid: tuple[Any, ...]) -> None:
    if value not in valid:
        raise UsageError(f"Unsupported {what} '{value}': use one of {', '.join(str(v) for v in valid)}.")


def _integer(what: str, value: Any, low: int, high: int | None = None) -> None:
    bad = not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high)
    if bad:
        bounds = f"{low}-{high}" if high is not None else f">= {low}"
        raise UsageError(f"{what} must be an integer {bounds}, got {value!r}.")


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """Measuring schedule knobs (see :mod:`forgekit.tuning`).

    ``trials``: new measurements (``0`` reuses records only); ``records``: the shared cache folder,
    None for the default, False for the artifact's own records only; ``rpc``: a
    :class:`forgekit.devices.rpc.RpcConfig` to measure on a board instead of this machine.
    """

    trials: int = 0
    records: str | Path | bool | None = None
    rpc: Any = None

    def __post_init__(self) -> None:
        _integer("tuning_trials", self.trials, 0)


@dataclass(frozen=True, kw_only=True)
class CompileOptions:
    """Everything :func:`forgekit.compiler.compile_model` needs besides the model."""

    target: Any = DEFAULT_TARGET
    host: Any = None
    output_path: str | Path = DEFAULT_OUTPUT
    opt_level: int = 3
    #: any spelling of a :class:`Precision` (``"fp16"``, ``"float16"``...): a :class:`Precision` once made
    precision: Precision | str = Precision.FP32
    layout: str | None = None
    #: any spelling of a :class:`GpuKernels` (CUDA targets: whose convolution kernels)
    gpu_kernels: GpuKernels | str = GpuKernels.AUTO
    export_ir: bool = False
    export_metadata: bool = False
    force: bool = False
    uuid: str | None = None
    encrypt_password: str | None = field(default=None, repr=False)
    tuning: TuneOptions | None = None
    #: files and folders the command read (the model, calibration data...): never inside the output
    inputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _integer("opt_level", self.opt_level, OPT_LEVELS[0], OPT_LEVELS[-1])
        object.__setattr__(self, "precision", Precision.parse(self.precision))
        object.__setattr__(self, "layout", normalize_layout(self.layout))
        object.__setattr__(self, "gpu_kernels", GpuKernels.parse(self.gpu_kernels))
        if self.uuid is not None:
            try:
                object.__setattr__(self, "uuid", str(_uuid.UUID(str(self.uuid))))
            except ValueError:
                raise UsageError(f"uuid '{self.uuid}' is not a valid UUID.") from None
        if self.encrypt_password is not None:
            from .crypto.password import check_new_password

            check_new_password(self.encrypt_password)
        object.__setattr__(self, "inputs", tuple(str(p) for p in self.inputs if p))

    @classmethod
    def from_forge(cls, *, set_float16: bool = False, set_bfloat16: bool = False, set_channel_layout: str | None = None,
                   export_relay: bool = False, force_overwrite: bool = False, tuning_trials: int | None = None,
                   records: Any = None, tuning_rpc: Any = None, **kwargs: Any) -> CompileOptions:
        """Options from Forge's ``compile`` keyword names (``set_float16``, ``force_overwrite``...)."""
        if tuning_trials is None and tuning_rpc is not None:
            raise UsageError("An RPC device for tuning was given without tuning: add --tune-trials N.")
        tuning = None if tuning_trials is None else TuneOptions(trials=tuning_trials, records=records, rpc=tuning_rpc)
        if set_float16 and set_bfloat16:
            raise UsageError("set_float16 and set_bfloat16 exclude each other: pick one precision.")
        precision = Precision.FP16 if set_float16 else Precision.BF16 if set_bfloat16 else Precision.FP32
        return cls(precision=precision, layout=set_channel_layout,
                   export_ir=export_relay, force=force_overwrite, tuning=tuning, **kwargs)

    def with_(self, **changes: Any) -> CompileOptions:
        """A copy with ``changes`` (validated again)."""
        return replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class QuantizeOptions:
    """Post-training quantization (see :meth:`forgekit.IRModule.quantize` for what each one means)."""

    activation_dtype: str = "int8"
    kernel_dtype: str | None = None
    bias_dtype: str | None = None
    per_channel: bool = False
    calib_method: str = "average"
    quant_type: str = "any"
    percentile: float = 99.0
    smoothing: float | None = 0.75
    max_accuracy_drop: float | None = None
    quantize_depthwise: bool = False
    bias_correction: bool = True

    def __post_init__(self) -> None:
        _choice("activation dtype", self.activation_dtype, ACTIVATION_DTYPES)
        _choice("kernel dtype", self.kernel_dtype, (None, "int8"))
        _choice("bias dtype", self.bias_dtype, (None, "int32", "float32"))
        _choice("calibration method", self.calib_method, CALIB_METHODS)
        _choice("quantization type", self.quant_type, QUANT_TYPES)
        if not 0 < float(self.percentile) <= 100:
            raise UsageError(f"percentile must be in (0, 100], got {self.percentile}.")
        if self.max_accuracy_drop is not None and not 0 <= self.max_accuracy_drop <= 1:
            raise UsageError(f"max_accuracy_drop must be a fraction between 0 and 1 (e.g. 0.01), got "
                             f"{self.max_accuracy_drop}.")

    def rewrite_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`forgekit.quantize.quantize` (all but the accuracy budget)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "max_accuracy_drop"}


#: the defaults, for option declarations (the CLI shows them) — never restated elsewhere
COMPILE_DEFAULTS = CompileOptions()
QUANTIZE_DEFAULTS = QuantizeOptions()

ProgressFn = Callable[[int, int, str], None]
