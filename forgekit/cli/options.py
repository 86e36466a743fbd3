"""Options shared by several verbs, declared once (``Annotated`` types), and the parsing of their values.

Defaults come from :mod:`forgekit.options`, never restated here.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from ..errors import InputError, UsageError
from ..options import COMPILE_DEFAULTS, QUANTIZE_DEFAULTS

if TYPE_CHECKING:
    import numpy as np

ModelArg = Annotated[Optional[str], typer.Argument(metavar="MODEL", help="ONNX file or sample:NAME (LEIP spelling: --input_path MODEL).")]
DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", metavar="DEV", help="cpu, cuda or cuda:N (default: what the artifact was built for).")]
CudaGraphsOpt = Annotated[bool, typer.Option(
    "--cuda-graphs", help="CUDA artifacts: replay each input shape's whole inference as one CUDA graph (captured at "
    "its second call): launch-bound models (batch 1) run at their kernels' speed.")]
InputPathOpt = Annotated[Optional[str], typer.Option("--input_path", "--input-path", metavar="MODEL", hidden=True)]
ShapeOpt = Annotated[Optional[list[str]], typer.Option(
    "--input-shape", "--input_shape", metavar="NAME=DIMS",
    help="Pin an input shape, e.g. x=1x3x224x224; a name keeps a dimension dynamic: x=Nx3x224x224.")]
DynamicOpt = Annotated[Optional[list[str]], typer.Option(
    "--dynamic", metavar="DIM=MIN..MAX[:STEP]", help="Sizes a dynamic dimension serves, e.g. W=32..2048 (with "
    "--input-shape x=1x3x48xW), or H=32..2048:32 for multiples of 32 only (detectors); others are refused at "
    "run time.")]
FreezeOpt = Annotated[Optional[list[str]], typer.Option(
    "--freeze", metavar="NAME=VALUE", help="Make an input a constant (e.g. sr=16000), so branches on it fold.")]
InputOpt = Annotated[Optional[list[str]], typer.Option("--input", "-i", metavar="NAME=FILE",
                                                       help="name=file.npy, file.npy or file.npz.")]
JsonOpt = Annotated[Optional[str], typer.Option("--json", metavar="FILE", help="Also write the result as JSON "
                                                "to FILE ('-': standard output).")]
PasswordFileOpt = Annotated[Optional[str], typer.Option(
    "--password-file", metavar="FILE",
    help="File holding the password ('-': stdin). Never on the command line.")]
KeyOpt = Annotated[Optional[str], typer.Option("--key", metavar="FILE", help="Key file of an encrypted artifact "
                                               "(default: modelKey.bin next to it).")]
ForceOpt = Annotated[bool, typer.Option("--force", "-f", help="Replace an existing output of forgekit's.")]
RpcTrackerOpt = Annotated[Optional[str], typer.Option("--rpc-tracker", metavar="HOST:PORT", help="A TVM RPC tracker: "
                                                      "run on a board registered there (with --rpc-key).")]
RpcKeyOpt = Annotated[Optional[str], typer.Option("--rpc-key", metavar="KEY", help="The key the board registered "
                                                  "with at the tracker.")]
RpcHostOpt = Annotated[Optional[str], typer.Option("--rpc-host", metavar="HOST:PORT", help="One TVM RPC server, "
                                                   "without a tracker.")]

# quantization (compile --quantize and quantize-report)
Q = QUANTIZE_DEFAULTS
CalibDataOpt = Annotated[Optional[str], typer.Option("--calib-data", metavar="PATH",
                                                     help="Calibration samples: .npy, .npz or a folder.")]
CalibMethodOpt = Annotated[str, typer.Option("--calib-method", metavar="M", help="average, entropy, minmax or "
                                             "percentile.")]
PerChannelOpt = Annotated[bool, typer.Option("--per-channel", help="One weight scale per output channel.")]
QuantTypeOpt = Annotated[str, typer.Option("--quant-type", metavar="T", help="static (needs --calib-data), dynamic "
                                           "or any.")]
MaxDropOpt = Annotated[Optional[float], typer.Option("--max-accuracy-drop", metavar="D", help="Keep the most "
                                                     "sensitive layers in fp32 until the drop (e.g. 0.01) is met.")]
DepthwiseOpt = Annotated[bool, typer.Option("--quantize-depthwise", help="Quantize depthwise convolutions too "
                                            "(fp32 by default: no faster in int8, and lossier).")]
BiasCorrectionOpt = Annotated[bool, typer.Option("--bias-correction/--no-bias-correction", help="Remove the mean "
                                                 "output error of weight rounding (static).")]

C = COMPILE_DEFAULTS

#: the quantization options of ``compile --quantize`` and ``quantize-report``, declared once
QUANTIZE_OPTIONS: dict[str, tuple[object, object]] = {
    "calib_method": (CalibMethodOpt, Q.calib_method),
    "per_channel": (PerChannelOpt, Q.per_channel),
    "quant_type": (QuantTypeOpt, Q.quant_type),
    "max_accuracy_drop": (MaxDropOpt, Q.max_accuracy_drop),
    "quantize_depthwise": (DepthwiseOpt, Q.quantize_depthwise),
    "bias_correction": (BiasCorrectionOpt, Q.bias_correction),
}


def rpc_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give a verb ``--rpc-tracker``/``--rpc-key``/``--rpc-host``; it receives ``rpc``: an
    :class:`~forgekit.devices.rpc.RpcConfig`, or None when no board was named."""
    from ..devices.rpc import RpcConfig
    from .app import with_options

    extra = {"rpc_tracker": (RpcTrackerOpt, None), "rpc_key": (RpcKeyOpt, None), "rpc_host": (RpcHostOpt, None)}
    return with_options(func, extra, lambda v: {"rpc": RpcConfig.from_options(v["rpc_tracker"], v["rpc_key"],
                                                                               v["rpc_host"])}, provides=("rpc",))


def quantize_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give a verb the shared quantization options; it receives them in its ``**quant`` (the
    :class:`~forgekit.options.QuantizeOptions` fields they set)."""
    from .app import with_options

    return with_options(func, QUANTIZE_OPTIONS, lambda values: values)


def parse_shapes(specs: list[str] | None) -> dict[str, list[int | str]] | None:
    """``["x=1x3x224x224", "mask=1,128", "x=[1,3,224,224]"]`` -> ``{"x": [1, 3, 224, 224], ...}``.

    Symbol names stay strings; anything else that is not a positive integer is a one-line UsageError
    naming the dimension (``-1``, ``0``, ``?``)."""
    if not specs:
        return None
    out: dict[str, list[int | str]] = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        dims = dims.strip().strip("[]()")
        if not sep or not name or not dims:
            raise UsageError(f"--input-shape '{spec}' must look like name=1x3x224x224.")
        parts = [p.strip() for p in dims.replace(",", "x").split("x")]
        if any(not p for p in parts):
            raise UsageError(f"--input-shape '{spec}' has an empty dimension: write name=1x3x224x224.")
        shape: list[int | str] = []
        for axis, part in enumerate(parts):
            if part.lstrip("-").isdigit():
                if int(part) < 1:
                    raise UsageError(f"--input-shape '{spec}': dimension {axis} is {int(part)}; every dimension must "
                                     "be at least 1 (a name such as N keeps it dynamic).")
                shape.append(int(part))
            elif part.isidentifier():
                shape.append(part)
            else:
                raise UsageError(f"--input-shape '{spec}': dimension {axis} '{part}' is neither a positive integer "
                                 "nor a name.")
        out[name.strip()] = shape
    return out


def parse_dynamic(specs: list[str] | None) -> dict[str, str] | None:
    """``["W=32..2048", "batch=..8", "H=32..2048:32"]`` -> ``{"W": "32..2048", ...}``; a malformed range is a
    usage error here, a name the model does not have is checked at import."""
    from ..importer.dynamic import parse_range
    from ..importer.errors import PrepareError

    if not specs:
        return None
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        # any dim_param the model spells ("DynamicDimension.0", "batch size"): the import checks it exists
        if not sep or not name.strip() or ".." not in value:
            raise UsageError(f"--dynamic '{spec}' must look like W=32..2048 (a dimension name, then min..max, "
                             "optionally :step for multiples of it).")
        try:
            parse_range(name.strip(), value)
        except PrepareError as exc:
            raise UsageError(f"--dynamic '{spec}': {exc}") from None
        out[name.strip()] = value
    return out


def parse_freeze(specs: list[str] | None) -> dict[str, float | int] | None:
    """``["sr=16000", "scale=0.5"]`` -> ``{"sr": 16000, "scale": 0.5}``."""
    if not specs:
        return None
    out: dict[str, float | int] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        try:
            number: float | int = int(value) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError:
            raise UsageError(f"--freeze '{spec}' must look like name=16000 (a number).") from None
        if not sep or not name:
            raise UsageError(f"--freeze '{spec}' must look like name=16000.")
        out[name.strip()] = number
    return out


def model_arg(model: str | None, input_path: str | None) -> str:
    """The model path from MODEL or LEIP's --input_path, ``sample:NAME`` resolved (the one place it is)."""
    from ..samples import resolve

    if model and input_path and model != input_path:
        raise UsageError("Give the model once: as MODEL or as --input_path, not both.")
    chosen = model or input_path
    if not chosen:
        raise UsageError("No model given: pass MODEL (an .onnx path or sample:NAME).")
    return resolve(chosen)


def optional_model(model: str | None) -> str | None:
    """``--onnx MODEL`` resolved (``sample:NAME``), or None."""
    from ..samples import resolve

    return resolve(model) if model else None


def password(password_file: str | None, confirm: bool = False) -> str:
    """The password from --password-file, FORGEKIT_ENCRYPT_PASSWORD or a prompt (never argv)."""
    from ..crypto import password_from_env_or_file

    return password_from_env_or_file(password_file, prompt=sys.stdin.isatty(), confirm=confirm)


def password_if_encrypted(artifact: str, password_file: str | None) -> str | None:
    """The password when ``artifact``'s library is encrypted, else None (nothing is asked)."""
    from .. import crypto
    from ..artifact.layout import resolve

    return password(password_file) if crypto.is_encrypted(resolve(artifact)[0]) else None


def write_json(path: str | None, data: object) -> None:
    """``--json FILE``: the result as JSON to FILE, or to stdout for ``-``."""
    import json

    if not path:
        return
    text = json.dumps(data, indent=2) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    from pathlib import Path

    from ..artifact.outputs import write_error

    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise write_error(Path(path), exc) from None


def fmt_shape(shape: object) -> str:
    return "x".join(str(d) for d in shape) or "scalar"  # type: ignore[attr-defined]


# accelerator offload (compile --offload)
OffloadOpt = Annotated[Optional[str], typer.Option("--offload", metavar="ACCEL", help="Plan the accelerator offload "
                                                   "(tidl: TI boards) and, with TI's tools, build it.")]


def _read_array(file: str) -> Any:
    """A ``.npy``/``.npz`` file, never unpickled; one line when it is something else."""
    from pathlib import Path

    import numpy as np

    path = Path(file)
    if not path.is_file():
        raise InputError(f"Input file '{file}' does not exist.")
    try:
        return np.load(path, allow_pickle=False)
    except Exception:  # noqa: BLE001 - numpy's message suggests allow_pickle=True: never advise that
        raise InputError(f"'{file}' is not a NumPy .npy or .npz file: save the input with numpy.save.") from None


def read_input_files(specs: list[str]) -> dict[str, np.ndarray] | list[np.ndarray]:
    """``--input name=file.npy`` / ``file.npy`` / ``file.npz``: the arrays by name, or in order when unnamed
    (``run``, ``verify``, ``bench``)."""
    import numpy as np

    feeds: dict[str, np.ndarray] = {}
    positional: list[np.ndarray] = []
    for spec in specs:
        name, sep, file = spec.partition("=") if "=" in spec else ("", "", spec)
        loaded = _read_array(file)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                feeds.update({k: loaded[k] for k in loaded.files})
        elif sep:
            feeds[name] = loaded
        else:
            positional.append(loaded)
    if feeds and positional:
        raise UsageError("Mix of named (name=file) and unnamed inputs: name all of them.")
    return feeds or positional
