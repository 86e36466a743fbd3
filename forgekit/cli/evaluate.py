"""``forgekit bench`` and ``forgekit verify``: adapters over :mod:`forgekit.evaluate`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .. import log
from ..errors import VerificationError
from ..evaluate.compare import ATOL, NOISE_FACTOR, RTOL
from .app import app, command
from .options import (InputOpt, JsonOpt, KeyOpt, PasswordFileOpt, optional_model, password_if_encrypted,
                      read_input_files, rpc_options, write_json)

OnnxOpt = Annotated[Optional[str], typer.Option("--onnx", metavar="MODEL", help="The ONNX model (or sample:NAME) "
                                                "it was compiled from: the reference.")]


def _line(name: str, t: Any) -> str:
    return (f"{name:13s} median {t.median_ms:8.2f} ms  p90 {t.p90_ms:8.2f} ms  min {t.min_ms:8.2f} ms  "
            f"{t.throughput_per_s:8.1f}/s" + (f"  peak RSS {t.peak_rss_mb:.0f} MB" if t.peak_rss_mb else ""))


@app.command()
@command
@rpc_options
def bench(
    artifact: Annotated[str, typer.Argument(metavar="ARTIFACT", help="Artifact directory.")],
    onnx_model: OnnxOpt = None,
    runs: Annotated[int, typer.Option("--runs", "-n", min=1, metavar="N", help="Timed runs per runtime.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", min=0, metavar="N", help="Untimed runs first.")] = 3,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, metavar="N", help="Threads for both runtimes "
                                                   "(default: the target's core count).")] = None,
    no_memory: Annotated[bool, typer.Option("--no-memory", help="Skip the peak-RSS probes.")] = False,
    profile: Annotated[bool, typer.Option("--profile", help="Also time every kernel: the heaviest, their share "
                                          "and GFLOP/s (GFLOP/s needs --export-metadata at compile).")] = False,
    peer: Annotated[Optional[list[str]], typer.Option("--peer", metavar="RUNTIME", help="Also time another "
                                                      "runtime on --onnx: openvino (f32 and its default "
                                                      "precision). Repeatable.")] = None,
    inputs: InputOpt = None,
    json_out: JsonOpt = None,
    markdown_out: Annotated[Optional[str], typer.Option("--markdown", metavar="FILE",
                                                        help="Also write a markdown table.")] = None,
    key: KeyOpt = None,
    password_file: PasswordFileOpt = None,
    rpc: Any = None,
) -> None:
    """Time an artifact (latency, throughput, peak memory) against onnxruntime on the same model.

    With --rpc-tracker/--rpc-key (or --rpc-host) it runs on a board through TVM's RPC and its outputs are
    compared with onnxruntime on this machine.  On --input files, or on seeded random inputs within the values
    the artifact records.  Exit 13 when the outputs differ from onnxruntime's."""
    from ..evaluate.bench import benchmark_artifact, markdown_table

    result = benchmark_artifact(artifact, optional_model(onnx_model), runs=runs, warmup=warmup, threads=threads,
                                memory=not no_memory, key_path=key, password=password_if_encrypted(artifact, password_file),
                                rpc=rpc, peers=peer or (), profile=profile,
                                inputs=read_input_files(inputs) if inputs else None)
    fk, ort = result.forgekit, result.onnxruntime
    if "rpc" in result.extra:
        rpc = result.extra["rpc"]
        print(f"device        {rpc['device']} ({rpc.get('remote_arch') or 'unknown arch'}), timed there")
    print(_line("forgekit", fk))
    if "level" in result.extra:  # a portable artifact: the instruction-set level this CPU ran
        print(f"level         {result.extra['level']}, chosen for this CPU")
    if ort is not None:
        print(_line("onnxruntime", ort))
        verdict = "faster" if result.ratio < 1 else "slower"
        print(f"ratio         {result.ratio:.2f}x onnxruntime's latency ({verdict}), {result.threads} thread(s)")
    for label, timing in result.peers.items():
        info = result.peer_info[label]
        ratio = result.peer_ratio(label)
        print(_line(label, timing))
        print(f"{'':13s} forgekit {ratio:.2f}x its latency ({'faster' if ratio < 1 else 'slower'}); its outputs "
              f"{'match' if info['outputs_match'] else 'differ from'} onnxruntime's "
              f"(max abs error {info['max_abs_error']:.2e})")
    if result.outputs_match is not None:
        own = (f" (onnxruntime's own fp32 cosine {result.extra['reference_cosine']:.6f}, optimized vs unoptimized "
               f"graph: an ill-conditioned output, judged within {NOISE_FACTOR:g}x its deficit)"
               if "reference_cosine" in result.extra else "")
        if result.extra.get("bf16_reference_cosine", 1.0) < result.extra.get("reference_cosine", 1.0):
            own = (f" (onnxruntime with bf16-rounded conv/matmul operands: cosine "
                   f"{result.extra['bf16_reference_cosine']:.6f}, an output bf16 rounding moves that much; judged "
                   f"within {NOISE_FACTOR:g}x its deficit)")
        how = (f"least cosine {result.extra['min_cosine']:.6f}{own}, reduced-precision artifact; "
               if "min_cosine" in result.extra else
               f"within {NOISE_FACTOR:g}x onnxruntime's own noise {result.extra['noise_floor']:.1e} (optimized vs "
               "unoptimized graph, or for a model that quantizes at run time inputs (or weights, fed no float) a "
               "few ulps apart) on this "
               "ill-conditioned output; " if "noise_floor" in result.extra else "")
        print(f"outputs       {'match' if result.outputs_match else 'DIFFER from'} onnxruntime's "
              f"({how}max abs error {result.max_abs_error:.2e})")
    if "profile" in result.extra:
        from ..evaluate.profile import KernelTime, table

        print("\nkernels (instrumented runs, per inference):")
        print(table([KernelTime(**k) for k in result.extra["profile"]]))
    write_json(json_out, result.to_dict())
    if markdown_out:
        Path(markdown_out).write_text(markdown_table([(Path(artifact).name, result)]))
    if result.outputs_match is False:
        raise VerificationError(f"'{artifact}' outputs differ from onnxruntime's (max abs error "
                                f"{result.max_abs_error:.3g}): the timing is of a wrong model; run 'forgekit verify'.")


@app.command()
@command
def verify(
    artifact: Annotated[str, typer.Argument(metavar="ARTIFACT", help="Artifact directory.")],
    onnx_model: OnnxOpt = None,
    rtol: Annotated[float, typer.Option("--rtol", min=0, metavar="R", help="Relative tolerance.")] = RTOL,
    atol: Annotated[float, typer.Option("--atol", min=0, metavar="A", help="Absolute tolerance x max|ref|.")] = ATOL,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the random inputs.")] = 0,
    inputs: InputOpt = None,
    json_out: JsonOpt = None,
    key: KeyOpt = None,
    password_file: PasswordFileOpt = None,
) -> None:
    """Run an artifact on its own CPU architecture (aarch64 under qemu) and compare with onnxruntime.

    On --input files, or on seeded random inputs within the values the artifact records (an index's table
    size, a quantized model's calibration range).  Exits 13 when an output differs beyond the tolerances."""
    from ..errors import UsageError
    from ..evaluate.verify import verify_artifact

    model = optional_model(onnx_model)
    if model is None:
        raise UsageError("verify needs the ONNX model the artifact was compiled from: pass --onnx MODEL.")
    result = verify_artifact(artifact, model, rtol=rtol, atol=atol, seed=seed, key_path=key,
                             password=password_if_encrypted(artifact, password_file), log=log.status,
                             inputs=read_input_files(inputs) if inputs else None)
    for output in result.outputs:
        print(output.line())
    level = f", level {result.level}" if result.level else ""
    print(f"ran {result.target or result.arch} artifact{level} {result.runner} in {result.run_seconds:.1f} s "
          f"(inference {result.infer_ms:.1f} ms); reference onnxruntime on this host, "
          f"{'the --input arrays' if result.inputs_given else f'seed {seed}'}")
    write_json(json_out, result.to_dict())
    result.check()
    print("verified: outputs match onnxruntime")
