"""The ``forgekit`` command line: thin adapters over the library.

Every user error is a :class:`~forgekit.errors.ForgekitError`: it is printed as one line
(``error: ...``, plus a ``::error::`` annotation on GitHub Actions) and the process exits with the
error's code.  ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional

import numpy as np
import typer

from . import __version__
from .errors import ForgekitError, InputError, UsageError

app = typer.Typer(
    name="forgekit",
    help="Compile ONNX models into fast, deployable libraries for CPUs, ARM boards, Android and CUDA.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_STATE = {"debug": False}


def _fail(message: str, code: int) -> None:
    if os.environ.get("GITHUB_ACTIONS") == "true":
        print(f"::error::forgekit: {message}", file=sys.stderr)
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def _command(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn ForgekitError into one line and an exit code (traceback with --debug)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ForgekitError as exc:
            if _STATE["debug"]:
                raise
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)

    return wrapper


def _version(value: bool) -> None:
    if value:
        print(f"forgekit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    _STATE["debug"] = debug


# --------------------------------------------------------------------------- helpers
def parse_shapes(specs: list[str] | None) -> dict[str, list[int | str]] | None:
    """``["x=1x3x224x224", "mask=1,128"]`` → ``{"x": [1, 3, 224, 224], "mask": [1, 128]}``."""
    if not specs:
        return None
    out: dict[str, list[int | str]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        if not sep or not name or not dims:
            raise UsageError(f"--input-shape '{spec}' must look like name=1x3x224x224.")
        parts = dims.replace(",", "x").split("x")
        try:
            out[name] = [int(p) if p.strip().isdigit() else p.strip() for p in parts if p.strip()]
        except ValueError:
            raise UsageError(f"--input-shape '{spec}' has a bad dimension.") from None
    return out


def _model_arg(model: str | None, input_path: str | None) -> str:
    from .samples import resolve

    if model and input_path and model != input_path:
        raise UsageError("Give the model once: as MODEL or as --input_path, not both.")
    chosen = model or input_path
    if not chosen:
        raise UsageError("No model given: pass MODEL (an .onnx path or sample:NAME).")
    return resolve(chosen)


def _fmt_shape(shape: Any) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


PasswordFileOpt = Annotated[Optional[str], typer.Option(
    "--password-file", help="File holding the password ('-' reads stdin). Never pass a password on the command line.")]


def _password(password_file: str | None, confirm: bool = False) -> str:
    from .crypto import password_from_env_or_file

    return password_from_env_or_file(password_file, prompt=sys.stdin.isatty(), confirm=confirm)


ShapeOpt = Annotated[Optional[list[str]], typer.Option("--input-shape", "--input_shape",
                                                       help="Pin an input shape: name=1x3x224x224 (repeatable).")]


# --------------------------------------------------------------------------- inspect
@app.command()
@_command
def inspect(
    model: Annotated[Optional[str], typer.Argument(help="ONNX file or sample:NAME.")] = None,
    input_path: Annotated[Optional[str], typer.Option("--input_path", "--input-path", hidden=True)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    input_shape: ShapeOpt = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Only check importability, without importing: list every unsupported operator (with "
                        "node names) and every input that is still dynamic. Exit 4 if an operator is unsupported.")] = False,
) -> None:
    """Show a model's inputs, outputs, operators, hash and fingerprint (or, with --check, what blocks import)."""
    from .ir import from_onnx

    path = _model_arg(model, input_path)
    if check:
        _inspect_check(path, parse_shapes(input_shape), as_json)
        return
    ir = from_onnx(path, parse_shapes(input_shape))
    info = {
        "model": path,
        "inputs": [t.to_dict() for t in ir.input_nodes],
        "outputs": [t.to_dict() for t in ir.output_nodes],
        "operators": ir.operators,
        "graph_count": ir.graph_count,
        "subgraph_count": ir.subgraph_count,
        "hash": f"{ir.structural_hash():016x}",
        "fingerprint": ir.fingerprint,
    }
    if as_json:
        print(json.dumps(info, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=os.path.basename(path), show_header=True)
    for column in ("", "name", "shape", "dtype"):
        table.add_column(column)
    for kind, items in (("input", info["inputs"]), ("output", info["outputs"])):
        for t in items:
            table.add_row(kind, t["name"], _fmt_shape(t["shape"]), t["dtype"])
    console.print(table)
    ops = ", ".join(f"{k}×{v}" for k, v in info["operators"].items())
    console.print(f"operators: {ops}", highlight=False)
    console.print(f"hash: {info['hash']}   fingerprint: {info['fingerprint']}", highlight=False)


def _inspect_check(path: str, shapes: dict | None, as_json: bool) -> None:
    """``inspect --check``: the importer's pre-flight report; exit 4 when an operator is unsupported."""
    from .errors import UnsupportedOperatorError
    from .importer import check_report

    report = check_report(path, shapes)
    unsupported, dynamic = report["unsupported"], report["dynamic_inputs"]
    if as_json:
        print(json.dumps({"model": path, **report}, indent=2))
    else:
        if not unsupported:
            print(f"{path}: every operator is supported")
        by_op: dict[str, list[str]] = {}
        for item in unsupported:
            by_op.setdefault(item["op"], []).append(item["node"])
        for op, nodes in by_op.items():
            print(f"unsupported: {op} ({len(nodes)}): {', '.join(nodes)}")
        for item in dynamic:
            shape = "?" if item["shape"] is None else _fmt_shape(item["shape"])
            print(f"dynamic input: {item['name']} [{shape}]: pin it with --input-shape {item['name']}=...")
    if unsupported:
        raise typer.Exit(UnsupportedOperatorError.exit_code)


# --------------------------------------------------------------------------- compile
def parse_optimization(specs: list[str] | None) -> dict[str, int]:
    """LEIP's ``--optimization category:graph,iterations:N`` / ``category:kernel,level:L`` → {"iterations": N,
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
    """A progress bar on stderr while tuning (trials done, last kernel, time left)."""
    if not trials:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = [TextColumn("tuning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("left"),
               TimeRemainingColumn(), TextColumn("{task.description}")]
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task("", total=trials)

        def update(done: int, total: int, note: str) -> None:
            bar.update(task, completed=done, total=total, description=note)

        yield update


# --------------------------------------------------------------------------- quantization options
QuantizeOpt = Annotated[Optional[str], typer.Option("--quantize", help="Quantize conv/matmul: int8 or uint8 activations.")]
CalibDataOpt = Annotated[Optional[str], typer.Option("--calib-data", help="Calibration samples: .npy, .npz or a folder.")]
CalibMethodOpt = Annotated[str, typer.Option("--calib-method", help="average, entropy, minmax or percentile.")]
PerChannelOpt = Annotated[bool, typer.Option("--per-channel", help="One weight scale per output channel.")]
QuantTypeOpt = Annotated[str, typer.Option("--quant-type", help="static (needs --calib-data), dynamic or any.")]
MaxDropOpt = Annotated[Optional[float], typer.Option("--max-accuracy-drop", help="Keep the most sensitive layers in "
                                                     "fp32 until the drop (e.g. 0.01) is met on the calibration data.")]
DepthwiseOpt = Annotated[bool, typer.Option("--quantize-depthwise", help="Quantize depthwise convolutions too "
                                            "(by default they stay fp32: no faster in int8, and lossier).")]
BiasCorrectionOpt = Annotated[bool, typer.Option("--bias-correction/--no-bias-correction", help="Remove the mean "
                                                 "output error of weight rounding (static; on by default).")]


def quantize_ir(ir: Any, dtype: str, calib_data: str | None, method: str, per_channel: bool, quant_type: str,
                max_drop: float | None, depthwise: bool = False, bias_correction: bool = True) -> None:
    """Calibrate (when data is given) and quantize ``ir`` in place: the CLI's --quantize."""
    if calib_data is not None:
        ir.calibrate(calib_data)
    ir.quantize(activation_dtype=dtype, per_channel=per_channel, calib_method=method, quant_type=quant_type,
                max_accuracy_drop=max_drop, quantize_depthwise=depthwise, bias_correction=bias_correction)


@app.command()
@_command
def compile(  # noqa: A001 - the verb users type
    model: Annotated[Optional[str], typer.Argument(help="ONNX file or sample:NAME.")] = None,
    target: Annotated[str, typer.Option("--target", "-t", help="Target: tag, 'host', legacy string or JSON.")] = "host",
    host: Annotated[Optional[str], typer.Option("--host", help="Host CPU target of a GPU target.")] = None,
    output: Annotated[str, typer.Option("--output", "-o", "--output_path", "--output-path",
                                        help="Artifact directory to create.")] = "./compile_output",
    input_path: Annotated[Optional[str], typer.Option("--input_path", "--input-path", help="Model (LEIP spelling).")] = None,
    opt_level: Annotated[int, typer.Option("--opt-level", "-O", min=0, max=4, help="Optimization level 0-4.")] = 3,
    float16: Annotated[bool, typer.Option("--float16", help="Compute conv/matmul in fp16.")] = False,
    layout: Annotated[Optional[str], typer.Option("--layout", help="Channel layout: first|last|NCHW|NHWC.")] = None,
    export_ir: Annotated[bool, typer.Option("--export-ir", "--export-relay", help="Also write the IR as TVMScript.")] = False,
    export_metadata: Annotated[bool, typer.Option("--export-metadata", help="Also write compile_report.json.")] = False,
    force: Annotated[bool, typer.Option("--force", "-f", help="Replace an existing output directory.")] = False,
    uuid: Annotated[Optional[str], typer.Option("--uuid", help="UUID to record (random by default).")] = None,
    input_shape: ShapeOpt = None,
    encrypt: Annotated[bool, typer.Option("--encrypt", help="Encrypt the library; password from "
                                          "FORGEKIT_ENCRYPT_PASSWORD, --password-file or a prompt.")] = False,
    password_file: PasswordFileOpt = None,
    tune_trials: Annotated[Optional[int], typer.Option("--tune-trials", min=0, help="Measure up to N new schedule "
                                                       "settings on this machine (0: reuse records only).")] = None,
    records: Annotated[Optional[str], typer.Option("--records", help="Tuning records cache shared across models "
                                                   "(default: ~/.cache/forgekit/records).")] = None,
    optimization: Annotated[Optional[list[str]], typer.Option("--optimization", help="LEIP spelling: "
                            "category:graph,iterations:N (tuning) or category:kernel,level:1-4 (opt level).")] = None,
    rpc_tracker: RpcTrackerOpt = None,
    rpc_key: RpcKeyOpt = None,
    rpc_host: RpcHostOpt = None,
    quantize: QuantizeOpt = None,
    calib_data: CalibDataOpt = None,
    calib_method: CalibMethodOpt = "average",
    per_channel: PerChannelOpt = False,
    quant_type: QuantTypeOpt = "any",
    max_accuracy_drop: MaxDropOpt = None,
    quantize_depthwise: DepthwiseOpt = False,
    bias_correction: BiasCorrectionOpt = True,
) -> None:
    """Compile a model into an artifact directory (model_library.so + metadata.json)."""
    from .ir import from_onnx

    path = _model_arg(model, input_path)
    leip = parse_optimization(optimization)
    opt_level = leip.get("level", opt_level)
    tune_trials = leip.get("iterations", tune_trials)
    password = _password(password_file, confirm=True) if encrypt else None
    from .rpc import RpcConfig

    tuning_rpc = RpcConfig.from_options(rpc_tracker, rpc_key, rpc_host)  # measure tuning trials on that board
    ir = from_onnx(path, parse_shapes(input_shape))
    if quantize is not None:
        quantize_ir(ir, quantize, calib_data, calib_method, per_channel, quant_type, max_accuracy_drop,
                    quantize_depthwise, bias_correction)
    elif calib_data is not None:
        raise UsageError("--calib-data needs --quantize int8|uint8.")
    with _tuning_progress(tune_trials) as progress:
        result = ir.compile(target=target, host=host, output_path=output, opt_level=opt_level, set_float16=float16,
                            set_channel_layout=layout, export_relay=export_ir, export_metadata=export_metadata,
                            force_overwrite=force, uuid=uuid, encrypt_password=password, tuning_trials=tune_trials,
                            records=records, tuning_progress=progress, tuning_rpc=tuning_rpc)
    meta = result.metadata
    print(f"compiled {os.path.basename(path)} for {meta['build']['target_name']} "
          f"(opt level {opt_level}) in {meta['build']['compile_seconds']:.1f} s")
    print(f"artifact: {result.path}")
    print(f"library:  {result.library.name} ({meta['library']['size'] / 1e6:.1f} MB, sha256 {meta['library']['sha256'][:16]}…)")


# --------------------------------------------------------------------------- run
def _load_inputs(engine: Any, specs: list[str] | None, random: bool) -> list[np.ndarray]:
    if random:
        if specs:
            raise UsageError("Give either --input files or --random, not both.")
        return engine.example_inputs(random=True)
    if not specs:
        raise UsageError("No inputs: pass --input name=file.npy (or file.npz), or --random.")
    feeds: dict[str, np.ndarray] = {}
    positional: list[np.ndarray] = []
    for spec in specs:
        name, sep, file = spec.partition("=") if "=" in spec else ("", "", spec)
        file_path = Path(file)
        if not file_path.exists():
            raise InputError(f"Input file '{file}' does not exist.")
        try:
            loaded = np.load(file_path, allow_pickle=False)
        except Exception as exc:
            raise InputError(f"Cannot read '{file}' as .npy/.npz: {exc}") from None
        if isinstance(loaded, np.lib.npyio.NpzFile):
            feeds.update({k: loaded[k] for k in loaded.files})
        elif sep:
            feeds[name] = loaded
        else:
            positional.append(loaded)
    if feeds and positional:
        raise UsageError("Mix of named (name=file) and unnamed inputs: name all of them.")
    if feeds:
        return [feeds[n] if n in feeds else _missing(n) for n in engine.input_names] if engine.input_names \
            else list(feeds.values())
    return positional


def _missing(name: str) -> np.ndarray:
    raise InputError(f"No value for input '{name}'.")


def summarize(name: str, array: np.ndarray) -> str:
    """One line describing an output: shape, dtype, range, and top-5 classes for score vectors."""
    text = f"{name}: {_fmt_shape(array.shape)} {array.dtype}"
    if array.size and np.issubdtype(array.dtype, np.number):
        text += f" min={array.min():.4g} max={array.max():.4g} mean={array.mean():.4g}"
        # A score vector (one dimension larger than 1, e.g. 1x1000x1x1) gets its top-5 classes.
        big = [d for d in array.shape if d > 1]
        if len(big) == 1 and 10 <= big[0] <= 100000:
            flat = array.reshape(-1)
            top = np.argsort(flat)[::-1][:5]
            text += " top5=" + ",".join(f"{i}:{flat[i]:.3g}" for i in top)
    return text


@app.command()
@_command
def run(
    artifact: Annotated[str, typer.Argument(help="Artifact directory (or model_library.so).")],
    inputs: Annotated[Optional[list[str]], typer.Option("--input", "-i", help="name=file.npy, file.npy or file.npz (repeatable).")] = None,
    random: Annotated[bool, typer.Option("--random", help="Run on random inputs of the right shapes.")] = False,
    save: Annotated[Optional[str], typer.Option("--save", help="Write the outputs to this .npz file.")] = None,
    bench: Annotated[int, typer.Option("--bench", min=0, help="Also time this many runs.")] = 10,
    key: Annotated[Optional[str], typer.Option("--key", help="Key file of an encrypted artifact "
                                               "(default: modelKey.bin next to it).")] = None,
    password_file: PasswordFileOpt = None,
) -> None:
    """Run an artifact on inputs, print a summary of the outputs and the latency."""
    import time

    from . import crypto
    from .runtime import Engine, _resolve

    start = time.perf_counter()
    password = None
    if crypto.is_encrypted(_resolve(Path(artifact))[0]):
        password = _password(password_file)
    engine = Engine(artifact, key_path=key, password=password)
    load_ms = (time.perf_counter() - start) * 1e3
    feeds = _load_inputs(engine, inputs, random)
    outputs = engine.infer(*feeds)
    names = engine.output_names or [f"output_{i}" for i in range(len(outputs))]
    for name, array in zip(names, outputs):
        print(summarize(name, array))
    if save:
        save_path = Path(save)
        if save_path.exists():
            raise UsageError(f"'{save}' exists: choose another file name.")
        np.savez(save_path, **dict(zip(names, outputs)))
        print(f"outputs saved to {save_path}")
    if bench:
        stats = engine.benchmark(n=bench, warmup=1, inputs=feeds)
        print(f"latency: median {stats['median_ms']:.2f} ms, p90 {stats['p90_ms']:.2f} ms over {bench} runs "
              f"(load {load_ms:.0f} ms)")
    print(f"artifact: {Path(artifact).absolute()}")


# --------------------------------------------------------------------------- encryption
def _rewrite_metadata(directory: Path, encrypted: bool) -> None:
    """Re-render metadata.json after the library changed (encrypted flag, sha256 and size)."""
    from . import metadata as md

    meta = md.read_metadata(directory)
    sha, size = md.file_digest(directory / md.LIBRARY_FILE)
    meta["library"].update({"encrypted": encrypted, "sha256": sha, "size": size})
    (directory / md.METADATA_FILE).write_text(md.render_metadata(**{k: v for k, v in meta.items() if k != "schema"}))


def _artifact_dir(artifact: str) -> Path:
    from .errors import ArtifactError

    directory = Path(artifact)
    if not (directory / "model_library.so").is_file() or not (directory / "metadata.json").is_file():
        raise ArtifactError(f"'{artifact}' is not a forgekit artifact directory (model_library.so + metadata.json).")
    return directory


@app.command()
@_command
def encrypt(
    artifact: Annotated[str, typer.Argument(help="Artifact directory to encrypt in place.")],
    password_file: PasswordFileOpt = None,
) -> None:
    """Encrypt an existing artifact's library in place and write modelKey.bin next to it."""
    from . import crypto
    from .compiler import KEY_FILE
    from .metadata import read_metadata

    directory = _artifact_dir(artifact)
    library = directory / "model_library.so"
    if crypto.is_encrypted(library):
        raise UsageError(f"'{artifact}' is already encrypted.")
    meta = read_metadata(directory)
    crypto.encrypt_library(library, library, directory / KEY_FILE, _password(password_file, confirm=True),
                           uuid=meta["uuid"], fingerprint=meta["model"]["fingerprint"],
                           target=meta["build"]["target_name"])
    _rewrite_metadata(directory, encrypted=True)
    print(f"encrypted {library}; key file {directory / KEY_FILE}")


@app.command()
@_command
def decrypt(
    artifact: Annotated[str, typer.Argument(help="Encrypted artifact directory.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Directory for the decrypted artifact.")],
    key: Annotated[Optional[str], typer.Option("--key", help="Key file (default: modelKey.bin in ARTIFACT).")] = None,
    password_file: PasswordFileOpt = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Replace an existing output directory.")] = False,
) -> None:
    """Write a decrypted copy of an encrypted artifact (the original is left untouched)."""
    import shutil

    from . import crypto
    from .compiler import KEY_FILE, atomic_directory

    directory = _artifact_dir(artifact)
    key_path = Path(key) if key else directory / KEY_FILE
    password = _password(password_file)
    with atomic_directory(Path(output), force) as tmp:
        crypto.decrypt_library(directory / "model_library.so", key_path, password, tmp / "model_library.so")
        shutil.copy2(directory / "metadata.json", tmp / "metadata.json")
        _rewrite_metadata(tmp, encrypted=False)
    print(f"decrypted artifact: {Path(output).absolute()}")


@app.command()
@_command
def rekey(
    key: Annotated[str, typer.Argument(help="Key file (modelKey.bin) to re-protect.")],
    password_file: PasswordFileOpt = None,
    new_password_file: Annotated[Optional[str], typer.Option(
        "--new-password-file", help="File holding the new password (default: FORGEKIT_NEW_ENCRYPT_PASSWORD or a prompt).")] = None,
) -> None:
    """Change the password of a key file without re-encrypting the library."""
    from . import crypto

    old = _password(password_file)
    new = crypto.password_from_env_or_file(new_password_file, env="FORGEKIT_NEW_ENCRYPT_PASSWORD",
                                           prompt=sys.stdin.isatty(), confirm=True)
    crypto.rekey(key, old, new)
    print(f"re-keyed {key}")


# --------------------------------------------------------------------------- bench
@app.command()
@_command
def bench(
    artifact: Annotated[str, typer.Argument(help="Artifact directory.")],
    onnx_model: Annotated[Optional[str], typer.Option("--onnx", help="The ONNX model (or sample:NAME) it was "
                                                      "compiled from: timed with onnxruntime in the same run.")] = None,
    runs: Annotated[int, typer.Option("--runs", "-n", min=1, help="Timed runs per runtime.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs first.")] = 3,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="Threads for both runtimes "
                                                   "(default: the target's core count).")] = None,
    no_memory: Annotated[bool, typer.Option("--no-memory", help="Skip the peak-RSS probes.")] = False,
    json_out: Annotated[Optional[str], typer.Option("--json", help="Also write the result as JSON here.")] = None,
    markdown_out: Annotated[Optional[str], typer.Option("--markdown", help="Also write a markdown table here.")] = None,
    key: Annotated[Optional[str], typer.Option("--key", help="Key file of an encrypted artifact.")] = None,
    password_file: PasswordFileOpt = None,
    rpc_tracker: RpcTrackerOpt = None,
    rpc_key: RpcKeyOpt = None,
    rpc_host: RpcHostOpt = None,
) -> None:
    """Time an artifact (latency, throughput, peak memory) against onnxruntime on the same model.

    With --rpc-tracker/--rpc-key (or --rpc-host) it runs on a remote board through TVM's RPC and its
    outputs are compared with onnxruntime on this machine."""
    from . import crypto
    from .bench import benchmark_artifact, markdown_table
    from .runtime import _resolve
    from .samples import resolve

    password = _password(password_file) if crypto.is_encrypted(_resolve(Path(artifact))[0]) else None
    result = benchmark_artifact(artifact, resolve(onnx_model) if onnx_model else None, runs=runs, warmup=warmup,
                                threads=threads, memory=not no_memory, key_path=key, password=password,
                                rpc_tracker=rpc_tracker, rpc_key=rpc_key, rpc_host=rpc_host)
    fk, ort = result.forgekit, result.onnxruntime
    if "rpc" in result.extra:
        _print_remote_bench(result)
    else:
        print(f"forgekit     median {fk.median_ms:8.2f} ms  p90 {fk.p90_ms:8.2f} ms  min {fk.min_ms:8.2f} ms  "
              f"{fk.throughput_per_s:8.1f}/s" + (f"  peak RSS {fk.peak_rss_mb:.0f} MB" if fk.peak_rss_mb else ""))
    if ort is not None and "rpc" not in result.extra:
        print(f"onnxruntime  median {ort.median_ms:8.2f} ms  p90 {ort.p90_ms:8.2f} ms  min {ort.min_ms:8.2f} ms  "
              f"{ort.throughput_per_s:8.1f}/s" + (f"  peak RSS {ort.peak_rss_mb:.0f} MB" if ort.peak_rss_mb else ""))
        verdict = "faster" if result.ratio < 1 else "slower"
        print(f"ratio        {result.ratio:.2f}x onnxruntime's latency ({verdict}), {result.threads} thread(s); "
              f"outputs {'match' if result.outputs_match else 'DIFFER'} (max abs error {result.max_abs_error:.2e})")
    if json_out:
        Path(json_out).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    if markdown_out:
        Path(markdown_out).write_text(markdown_table([(Path(artifact).name, result)]))


# --------------------------------------------------------------------------- on-device over TVM RPC
RpcTrackerOpt = Annotated[Optional[str], typer.Option("--rpc-tracker", help="TVM RPC tracker HOST:PORT: bench "
                                                      "(or measure tuning trials) on a board registered there, "
                                                      "with --rpc-key.")]
RpcKeyOpt = Annotated[Optional[str], typer.Option("--rpc-key", help="Key the board's TVM RPC server registered "
                                                  "with at the tracker.")]
RpcHostOpt = Annotated[Optional[str], typer.Option("--rpc-host", help="One TVM RPC server HOST:PORT, "
                                                   "without a tracker.")]


def _print_remote_bench(result: Any) -> None:
    fk, rpc = result.forgekit, result.extra["rpc"]
    print(f"device       {rpc['device']} ({rpc.get('remote_arch') or 'unknown arch'}), timed there by TVM's "
          "time_evaluator")
    print(f"forgekit     median {fk.median_ms:8.3f} ms  p90 {fk.p90_ms:8.3f} ms  min {fk.min_ms:8.3f} ms  "
          f"{fk.throughput_per_s:8.1f}/s")
    if result.outputs_match is not None:
        print(f"outputs      {'match' if result.outputs_match else 'DIFFER from'} onnxruntime on this machine "
              f"(max abs error {result.max_abs_error:.2e})")


# --------------------------------------------------------------------------- publish
@app.command()
@_command
def publish(
    artifacts: Annotated[list[str], typer.Argument(help="Artifact directories of one model, one per target.")],
    version: Annotated[str, typer.Option("--version", help="Release version, semver-like (1.2.0, v1.2.0-rc.1).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Directory for the archives (DIST).")],
    include_key: Annotated[bool, typer.Option("--include-key", help="Also ship modelKey.bin of encrypted artifacts "
                                              "(an error when none is encrypted).")] = False,
    bench: Annotated[Optional[list[str]], typer.Option("--bench", help="A 'forgekit bench --json' result; its "
                                                       "target picks the bundle (repeatable).")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Model name in file names (default: the ONNX "
                                                "file name).")] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Replace an existing output directory.")] = False,
    json_out: Annotated[Optional[str], typer.Option("--json", help="Also write what was published as JSON here.")] = None,
) -> None:
    """Package artifacts as versioned, reproducible .tar.gz bundles with a model card, notes and SHA256SUMS."""
    from .publish import publish as publish_artifacts

    result = publish_artifacts(artifacts, version, output, include_key=include_key, force=force, bench=bench,
                               name=name)
    for bundle in result.bundles:
        print(f"{bundle.archive}  sha256 {bundle.sha256}  ({bundle.target}, latency "
              f"{'measured' if bundle.latency_measured else 'not measured'})")
    for note in result.notes:
        print(f"note: {note}")
    print(f"release notes: {result.release_notes}")
    if json_out:
        Path(json_out).write_text(json.dumps(result.to_dict(), indent=2) + "\n")


# --------------------------------------------------------------------------- verify
@app.command()
@_command
def verify(
    artifact: Annotated[str, typer.Argument(help="Artifact directory.")],
    onnx_model: Annotated[str, typer.Option("--onnx", help="The ONNX model (or sample:NAME) it was compiled from.")],
    rtol: Annotated[float, typer.Option("--rtol", min=0, help="Relative tolerance.")] = 1e-3,
    atol: Annotated[float, typer.Option("--atol", min=0, help="Absolute tolerance, times max|reference|.")] = 1e-4,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random inputs.")] = 0,
    json_out: Annotated[Optional[str], typer.Option("--json", help="Also write the result as JSON here.")] = None,
    key: Annotated[Optional[str], typer.Option("--key", help="Key file of an encrypted artifact.")] = None,
    password_file: PasswordFileOpt = None,
) -> None:
    """Run an artifact on its own CPU architecture (aarch64 under qemu) and compare with onnxruntime.

    Exits 13 when an output differs beyond the tolerances."""
    from . import crypto
    from .runtime import _resolve
    from .samples import resolve
    from .verify import verify_artifact

    password = _password(password_file) if crypto.is_encrypted(_resolve(Path(artifact))[0]) else None
    result = verify_artifact(artifact, resolve(onnx_model), rtol=rtol, atol=atol, seed=seed, key_path=key,
                             password=password, log=lambda line: print(f"verify: {line}", file=sys.stderr))
    for output in result.outputs:
        print(output.line())
    print(f"ran {result.target or result.arch} artifact {result.runner} in {result.run_seconds:.1f} s "
          f"(inference {result.infer_ms:.1f} ms); reference onnxruntime on this host, seed {seed}")
    if json_out:
        Path(json_out).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    result.check()
    print("verified: outputs match onnxruntime")


# --------------------------------------------------------------------------- targets
@app.command()
@_command
def targets(
    family: Annotated[Optional[str], typer.Option("--family", help="cuda, x86, arm or android.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show each tag's target string.")] = False,
) -> None:
    """List the target tags forgekit accepts (its own first, then TVM's)."""
    from .targets import list_target_tags

    try:
        rows = list_target_tags(verbose=True, family=family)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for tag, text in rows:
        print(f"{tag:40s} {text}" if verbose else tag)


# --------------------------------------------------------------------------- images
images_app = typer.Typer(help="Build forgekit's Docker images (offline, from a host-side wheelhouse).",
                         no_args_is_help=True)
app.add_typer(images_app, name="images")


@images_app.command("list")
@_command
def images_list() -> None:
    """List the images, their Dockerfiles and what they are for."""
    from .images import IMAGES

    for name, spec in IMAGES.items():
        print(f"{name:9s} {spec.dockerfile:28s} {spec.description}")


@images_app.command("wheelhouse")
@_command
def images_wheelhouse(
    dest: Annotated[str, typer.Argument(help="Directory to fill with wheels.")],
    image: Annotated[Optional[list[str]], typer.Option("--image", help="Images whose extra wheels to include "
                                                       "(repeatable; default cpu).")] = None,
    platform: Annotated[Optional[str], typer.Option("--platform", help="pip platform tag of the image, e.g. "
                                                    "manylinux_2_28_aarch64 (default: this machine's).")] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Replace an existing directory.")] = False,
) -> None:
    """Download forgekit's wheels (and build forgekit's own) for offline image builds."""
    from .images import build_wheelhouse

    build_wheelhouse(dest, images=image or ["cpu"], platform=platform, force=force)


@images_app.command("debootstrap")
@_command
def images_debootstrap(
    tag: Annotated[str, typer.Argument(help="Tag of the base image to create, e.g. local/bookworm-python:3.11.")],
    rootfs_tar: Annotated[Optional[str], typer.Option("--rootfs-tar", help="Keep (and reuse) the rootfs "
                                                      "tarball here.")] = None,
    mirror: Annotated[str, typer.Option("--mirror", help="Debian mirror.")] = "http://deb.debian.org/debian",
) -> None:
    """Make a Python 3.11 Debian base image without any registry (debootstrap + docker import; root)."""
    from .images import debootstrap_base

    print(f"base image: {debootstrap_base(tag, rootfs_tar=rootfs_tar, mirror=mirror)}")


@images_app.command("build")
@_command
def images_build(
    name: Annotated[str, typer.Argument(help="Image: base, cpu, cuda, aarch64, android, cuda-gpu or ti.")],
    wheelhouse: Annotated[Optional[str], typer.Option("--wheelhouse", help="Wheelhouse from 'forgekit images "
                                                      "wheelhouse'.")] = None,
    base_image: Annotated[Optional[str], typer.Option("--base-image", help="Python 3.11 Debian image to start "
                                                      "from (default python:3.11.11-slim-bookworm).")] = None,
    tag: Annotated[Optional[str], typer.Option("--tag", help="Image tag (default forgekit/NAME:VERSION).")] = None,
    build_arg: Annotated[Optional[list[str]], typer.Option("--build-arg", help="KEY=VALUE for docker build "
                                                           "(repeatable).")] = None,
    tidl: Annotated[Optional[str], typer.Option("--tidl", help="TI's tidl_tools.tar.gz (ti image).")] = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Also rebuild the images it is built on.")] = False,
) -> None:
    """Build an image (and the shared base it needs) with docker build."""
    from .images import build_image

    args = {}
    for item in build_arg or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--build-arg '{item}' is not KEY=VALUE.")
        args[key] = value
    build_image(name, wheelhouse=wheelhouse, base_image=base_image, tag=tag, build_args=args, tidl=tidl,
                rebuild_parents=rebuild)


def main() -> None:
    """Console-script entry point."""
    app()


# --------------------------------------------------------------------------- quantize-report
@app.command("quantize-report")
@_command
def quantize_report(
    model: Annotated[str, typer.Argument(help="ONNX file or sample:NAME.")],
    calib_data: Annotated[str, typer.Option("--calib-data", help="Calibration samples: .npy, .npz or a folder.")],
    quantize: Annotated[str, typer.Option("--quantize", help="int8 or uint8 activations.")] = "int8",
    calib_method: CalibMethodOpt = "average",
    per_channel: PerChannelOpt = False,
    quant_type: QuantTypeOpt = "any",
    max_accuracy_drop: MaxDropOpt = None,
    quantize_depthwise: DepthwiseOpt = False,
    bias_correction: BiasCorrectionOpt = True,
    input_shape: ShapeOpt = None,
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Also write the report as JSON.")] = None,
) -> None:
    """Quantize a model and print per-layer cosine/SNR against fp32 and the output agreement."""
    import json

    from .ir import from_onnx
    from .quantize.report import accuracy_report

    ir = from_onnx(model, parse_shapes(input_shape))
    quantize_ir(ir, quantize, calib_data, calib_method, per_channel, quant_type, max_accuracy_drop,
                    quantize_depthwise, bias_correction)
    rep = ir.quantization_report or accuracy_report(ir)
    for layer in rep["layers"]:
        print(f"{layer['name']:24s} {layer['op']:7s} {layer['precision']:8s} cos {layer['cosine']:.5f}  "
              f"snr {layer['snr_db']:7.2f} dB")
    print(f"{rep['metric']}: {rep['agreement']:.5f} (drop {rep['accuracy_drop']:.5f}) on {rep['samples']} samples; "
          f"fp32 layers: {', '.join(rep['fp32_layers']) or 'none'}")
    if output:
        Path(output).write_text(json.dumps(rep, indent=2) + "\n")
