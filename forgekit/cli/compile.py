"""``forgekit compile`` (and ``quantize-report``): a model in, an artifact directory out."""

from __future__ import annotations

import collections
import contextlib
import os
import time
from typing import Annotated, Any, Iterator, Optional

import typer

from .. import log, progress
from ..errors import UsageError
from ..options import CompileOptions, Precision, QuantizeOptions, TuneOptions
from .app import app, command, deprecated
from .options import (C, Q, CalibDataOpt, DynamicOpt, ForceOpt, FreezeOpt, InputPathOpt, JsonOpt, ModelArg,
                      OffloadOpt, PasswordFileOpt, ShapeOpt, model_arg, parse_dynamic, parse_freeze, parse_shapes,
                      password, quantize_options, rpc_options, write_json)

#: seconds a compile step runs before a log (no terminal) gets stage lines
QUIET_SECONDS = 5.0

QuantizeOpt = Annotated[Optional[str], typer.Option("--quantize", metavar="DTYPE", help="Quantize conv/matmul: "
                                                    "int8 or uint8 activations.")]


def parse_optimization(specs: list[str] | None) -> dict[str, int]:
    """LEIP's ``--optimization category:graph,iterations:N`` / ``category:kernel,level:L`` -> {"iterations": N,
    "level": L}; kernel levels 1-4 map onto forgekit's opt levels 1-4."""
    out: dict[str, int] = {}
    for spec in specs or []:
        fields: dict[str, str] = {}
        for part in spec.split(","):
            key, sep, value = part.partition(":")
            if not sep:
                raise UsageError(f"Bad --optimization '{spec}': use category:graph,iterations:N or category:kernel,level:1-4.")
            fields[key.strip().lower()] = value.strip()
        category = fields.get("category", "").lower()
        try:
            if category == "graph" and "iterations" in fields:
                out["iterations"] = int(fields["iterations"])
                if out["iterations"] < 0:
                    raise ValueError
            elif category == "kernel" and "level" in fields:
                out["level"] = int(fields["level"])
                if out["level"] not in (1, 2, 3, 4):
                    raise ValueError
            else:
                raise ValueError
        except ValueError:
            raise UsageError(f"Bad --optimization '{spec}': use category:graph,iterations:N (N >= 0) or "
                             "category:kernel,level:1-4.") from None
    return out


@contextlib.contextmanager
def _tuning_progress(trials: int | None) -> Iterator[Any]:
    """A progress bar on the terminal while tuning (trials done, last kernel, time left)."""
    if not trials or log.verbosity() < log.NORMAL:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = [TextColumn("tuning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("left"),
               TimeRemainingColumn(), TextColumn("{task.description}")]
    with Progress(*columns, console=Console(file=log.terminal()), transient=False) as bar:
        task = bar.add_task("", total=trials)

        def update(done: int, total: int, note: str) -> None:
            bar.update(task, completed=done, total=total, description=note)

        yield update


def quantize_ir(ir: Any, dtype: str, calib_data: str | None, options: QuantizeOptions) -> None:
    """Calibrate (when data is given) and quantize ``ir`` in place: the CLI's --quantize."""
    if calib_data is not None:
        with _stage("calibrating"):
            ir.calibrate(calib_data)
    with _stage("quantizing"):
        ir.quantize_with(options)


@contextlib.contextmanager
def _stage(what: str) -> Iterator[None]:
    """A spinner naming the step and its stage (:mod:`forgekit.progress`: graph passes, kernels scheduled
    N/M, lowering per CPU level, linking) on a terminal.  In a log (no terminal) a step that runs past
    :data:`QUIET_SECONDS` prints a line per stage from then on; a quick one, or one that fails fast on bad
    input, prints nothing (an error stays the only stderr line)."""
    terminal = log.terminal()
    if log.verbosity() < log.NORMAL:
        yield
        return
    if not terminal.isatty():
        start, last = time.monotonic(), [""]

        def line(stage: str, done: int | None, total: int | None) -> None:
            if stage != last[0] and time.monotonic() - start > QUIET_SECONDS:
                last[0] = stage
                print(f"{what}: {stage}…", file=terminal, flush=True)

        with progress.listening(line):
            yield
        return
    from rich.console import Console

    with Console(file=terminal).status(f"{what}…") as status, progress.listening(
            lambda stage, done, total: status.update(f"{what}: {progress.describe(stage, done, total)}…")):
        yield


@app.command()
@command
@rpc_options
@quantize_options
def compile(  # noqa: A001 - the verb users type
    model: ModelArg = None,
    target: Annotated[str, typer.Option("--target", "-t", metavar="TARGET",
                                        help="Tag (forgekit targets), 'host', legacy string or JSON.")] = C.target,
    host: Annotated[Optional[str], typer.Option("--host", metavar="TARGET", help="CPU target of a GPU target.")] = None,
    output: Annotated[str, typer.Option("--output", "-o", "--output_path", "--output-path", metavar="DIR",
                                        help="Artifact directory to create.")] = str(C.output_path),
    input_path: InputPathOpt = None,
    opt_level: Annotated[int, typer.Option("--opt-level", "-O", min=0, max=4, metavar="N",
                                           help="Optimization level 0-4.")] = C.opt_level,
    float16: Annotated[bool, typer.Option("--float16", help="Compute conv/matmul in fp16.")] = False,
    precision: Annotated[str, typer.Option("--precision", metavar="P", help="fp32|bf16|fp16: conv/matmul precision "
                                           "(bf16: x86 targets with AVX512_BF16).")] = "fp32",
    layout: Annotated[Optional[str], typer.Option("--layout", metavar="L", help="first|last|NCHW|NHWC.")] = None,
    gpu_kernels: Annotated[str, typer.Option("--gpu-kernels", metavar="K", help="CUDA targets: cudnn "
                                             "(convolutions), vendor (cuDNN + cuBLAS matmuls), tvm or auto "
                                             "(cuDNN where its wheel is installed).")] = "auto",
    export_ir: Annotated[bool, typer.Option("--export-ir", "--export-relay", help="Also write the IR.")] = False,
    export_metadata: Annotated[bool, typer.Option("--export-metadata", help="Also write compile_report.json.")] = False,
    force: ForceOpt = False,
    uuid: Annotated[Optional[str], typer.Option("--uuid", metavar="UUID", help="UUID to record (default: random).")] = None,
    input_shape: ShapeOpt = None,
    dynamic: DynamicOpt = None,
    freeze: FreezeOpt = None,
    encrypt: Annotated[bool, typer.Option("--encrypt", help="Encrypt the library (password: "
                                          "FORGEKIT_ENCRYPT_PASSWORD, --password-file or a prompt).")] = False,
    password_file: PasswordFileOpt = None,
    tune_trials: Annotated[Optional[int], typer.Option("--tune-trials", min=0, metavar="N", help="Measure up to N "
                                                       "new schedule settings (0: reuse records only).")] = None,
    records: Annotated[Optional[str], typer.Option("--records", metavar="DIR", help="Tuning records shared by "
                                                   "all models (default: ~/.cache/forgekit/records).")] = None,
    optimization: Annotated[Optional[list[str]], typer.Option("--optimization", metavar="SPEC", help="LEIP: "
                            "category:graph,iterations:N or category:kernel,level:1-4.")] = None,
    quantize: QuantizeOpt = None,
    calib_data: CalibDataOpt = None,
    offload: OffloadOpt = None,
    rpc: Any = None,
    **quant: Any,
) -> None:
    """Compile a model into an artifact directory (model_library.so + metadata.json)."""
    from ..model import from_onnx

    path = model_arg(model, input_path)
    leip = parse_optimization(optimization)
    opt_level = leip.get("level", opt_level)
    tune_trials = leip.get("iterations", tune_trials)
    if rpc is not None and tune_trials is None:
        raise UsageError("An RPC device for tuning was given without tuning: add --tune-trials N.")
    if calib_data is not None and quantize is None and offload is None:
        raise UsageError("--calib-data needs --quantize int8|uint8 (or --offload tidl).")
    qoptions = QuantizeOptions(activation_dtype=quantize, **quant) if quantize is not None else None
    tuning = None if tune_trials is None else TuneOptions(trials=tune_trials, records=records, rpc=rpc)
    from ..artifact.outputs import check_output
    from ..targets import parse_target

    inputs = tuple(p for p in (path, calib_data, password_file if password_file != "-" else None) if p)
    spec = parse_target(target, host)  # the one parse: a bad target fails before a long import
    if offload is not None:
        from ..offload.tidl_driver import check_offload

        check_offload(offload, spec.name)
    precision = _precision(precision, float16)
    if precision is Precision.BF16:  # a target without AVX512_BF16 fails here, before the import
        from ..build import check_bf16

        check_bf16([spec], opt_level, spec.is_cpu and opt_level >= 3)
    options = CompileOptions(target=spec, output_path=output, opt_level=opt_level,
                             precision=precision, layout=layout, gpu_kernels=gpu_kernels, export_ir=export_ir,
                             export_metadata=export_metadata, force=force, uuid=uuid, tuning=tuning, inputs=inputs)
    check_output(output, force=force, kind="artifact", inputs=inputs)
    if encrypt:
        options = options.with_(encrypt_password=password(password_file, confirm=True))
    with _stage(f"importing {os.path.basename(path)}"):
        ir = from_onnx(path, parse_shapes(input_shape), freeze=parse_freeze(freeze), dynamic=parse_dynamic(dynamic))
    if qoptions is not None:
        quantize_ir(ir, qoptions.activation_dtype, calib_data, qoptions)
    building = _stage(f"compiling for {target} (opt level {opt_level})") if not tune_trials else contextlib.nullcontext()
    with _tuning_progress(tune_trials) as progress, building:  # one live display at a time
        result = ir.compile_with(options, tuning_progress=progress)
    _summary(os.path.basename(path), result, opt_level)
    if offload is not None:
        from ..offload.tidl_driver import offload_artifact

        for line in offload_artifact(offload, path, spec.name, result.path, parse_shapes(input_shape), calib_data):
            print(line)


def _precision(name: str, float16: bool) -> Precision:
    """--precision (fp32|bf16|fp16 or the long names) and the older --float16 -> a :class:`Precision`."""
    from ..options import PRECISION_NAMES

    precision = PRECISION_NAMES.get(name.lower())
    if precision is None:
        raise UsageError(f"Unsupported precision '{name}': use fp32, bf16 or fp16.")
    if float16 and precision not in (Precision.FP32, Precision.FP16):
        raise UsageError(f"--float16 and --precision {name} exclude each other: pick one.")
    return Precision.FP16 if float16 else precision


def _summary(model: str, result: Any, opt_level: int) -> None:
    """The end of a compile: what was built, where, how big, which kernels, and where it runs."""
    from ..artifact.layout import describe_device
    from ..runtime.cpu import describe_features
    from ..memory import peak_rss_mb

    meta = result.metadata
    build, library = meta["build"], meta["library"]
    print(f"compiled {model} for {build['target_name']} (opt level {opt_level}, {meta['model']['precision']}) "
          f"in {build['compile_seconds']:.1f} s, peak memory {peak_rss_mb():.0f} MB")
    print(f"artifact: {result.path}")
    print(f"library:  {result.library.name} ({library['size'] / 1e6:.1f} MB, sha256 {library['sha256'][:16]}…"
          f"{', encrypted' if library['encrypted'] else ''})")
    rules = collections.Counter(result.schedule_rules.values())
    if rules:
        top = ", ".join(f"{name} {count}" for name, count in rules.most_common(4))
        more = " ..." if len(rules) > 4 else ""
        print(f"kernels:  {sum(rules.values())} scheduled by forgekit's rules ({top}{more})")
    levels = library.get("variants") or []
    if levels:  # a portable artifact: one library per instruction-set level, the best loaded at run time
        weights = library.get("weights") or {}
        total = (sum(v["size"] for v in levels) + weights.get("size", 0)) / 1e6
        shared = f", weights stored once in {weights['file']}" if weights else ""
        print(f"levels:   {', '.join(v['name'] for v in levels)} ({total:.1f} MB in all{shared}; "
              "the best level a CPU has is loaded)")
    if build.get("arch"):
        features = build.get("cpu_features") or []
        host = describe_features(build['arch'], features) if features else build['arch']
        device = build.get("device") or {}
        gpu = f"{describe_device(device)}, on a host of " if device.get("kind") == "cuda" else ""
        print(f"runs on:  {gpu}{host}" + (" or better" if levels else "")
              + (" (metadata.json: build.device, build.cpu_features)" if gpu else
                 " (metadata.json: build.cpu_features)" if features else ""))


@app.command("quantize-report")
@command
@quantize_options
def quantize_report(
    model: ModelArg = None,
    calib_data: Annotated[Optional[str], typer.Option("--calib-data", metavar="PATH",
                                                      help="Calibration samples: .npy, .npz or a folder.")] = None,
    quantize: Annotated[str, typer.Option("--quantize", metavar="DTYPE", help="int8 or uint8 activations.")]
    = Q.activation_dtype,
    input_shape: ShapeOpt = None,
    json_out: JsonOpt = None,
    output: Annotated[Optional[str], typer.Option("--output", "-o", metavar="FILE", hidden=True)] = None,
    **quant: Any,
) -> None:
    """Quantize a model and print per-layer cosine/SNR against fp32 and the output agreement."""
    from ..model import from_onnx

    if output is not None:  # the first releases' spelling of --json FILE
        if json_out is not None:
            raise UsageError("Give the report's file once: --json FILE (--output is its old spelling).")
        deprecated("quantize-report --output/-o FILE", "--json FILE")
        json_out = output
    if not calib_data:
        raise UsageError("quantize-report needs calibration data: pass --calib-data PATH (.npy, .npz or a folder).")
    ir = from_onnx(model_arg(model, None), parse_shapes(input_shape))
    options = QuantizeOptions(activation_dtype=quantize, **quant)
    quantize_ir(ir, quantize, calib_data, options)
    rep = ir.quantization_report or ir.accuracy_report()
    write_json(json_out, rep)
    if json_out == "-":
        return
    for layer in rep["layers"]:
        alone = f"  drop alone {layer['solo_drop']:.5f}" if "solo_drop" in layer else ""
        print(f"{layer['name']:24s} {layer['op']:7s} {layer['precision']:8s} cos {layer['cosine']:.5f}  "
              f"snr {layer['snr_db']:7.2f} dB{alone}")
    print(f"{rep['metric']}: {rep['agreement']:.5f} (drop {rep['accuracy_drop']:.5f}) on {rep['samples']} samples; "
          f"fp32 layers: {', '.join(rep['fp32_layers']) or 'none'}")
