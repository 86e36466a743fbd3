"""Benchmark an artifact against onnxruntime on the same model, in the same run.

Speed is only meaningful as a ratio measured side by side on one machine at one moment (shared
machines drift by ±30 % between runs), so :func:`benchmark_artifact` times forgekit and onnxruntime in
one worker process, with equal thread counts, in alternating blocks of runs: a load swing then hits
both.  Between blocks the worker sleeps briefly, because both runtimes' thread pools spin for a while
after a call returns and would steal the other's cores.  Peak memory is measured in separate short
worker processes (one per runtime), since RSS cannot be attributed inside one process.

The worker is a fresh process (:mod:`.bench_worker`): thread counts are fixed when a runtime's thread pool
starts, so they cannot be changed in the caller's process.  On a board (``rpc_*``), the artifact runs on
the :class:`~forgekit.devices.rpc_device.RpcDevice` and only its outputs are compared with onnxruntime here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..artifact.layout import device_of, read_metadata, resolve
from ..errors import ArtifactError, ForgekitError, UsageError


@dataclass
class Timing:
    """Latency statistics of one runtime, in milliseconds."""

    runs: int
    median_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    throughput_per_s: float
    peak_rss_mb: float | None = None


@dataclass
class BenchResult:
    """forgekit vs onnxruntime on one model (``onnxruntime`` is None when no ONNX model was given)."""

    artifact: str
    threads: int
    forgekit: Timing
    onnxruntime: Timing | None = None
    compile_seconds: float | None = None
    max_abs_error: float | None = None
    output_scale: float | None = None
    outputs_match: bool | None = None
    target: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: other runtimes timed in the same run (``--peer openvino``): label -> timing, and label -> precision and
    #: agreement with onnxruntime (``max_abs_error``, ``output_scale``, ``outputs_match``)
    peers: dict[str, Timing] = field(default_factory=dict)
    peer_info: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """forgekit median / onnxruntime median (below 1: forgekit is faster)."""
        return self.forgekit.median_ms / self.onnxruntime.median_ms if self.onnxruntime else None

    def peer_ratio(self, label: str) -> float:
        """forgekit median / a peer's median (below 1: forgekit is faster)."""
        return self.forgekit.median_ms / self.peers[label].median_ms

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = self.ratio
        data["peer_ratios"] = {label: self.peer_ratio(label) for label in self.peers}
        return data


def _spawn(job: dict[str, Any], threads: int, password: str | None) -> dict[str, Any]:
    env = {**os.environ, "TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    if password is not None:
        from ..crypto import DEFAULT_PASSWORD_ENV

        env[DEFAULT_PASSWORD_ENV] = password
    with tempfile.TemporaryDirectory(prefix="forgekit-bench-") as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_file.write_text(json.dumps(job))
        proc = subprocess.run([sys.executable, "-m", "forgekit.evaluate.bench_worker", str(job_file), str(out_file)],
                              env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not out_file.exists():
            lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
            raise ArtifactError(f"The benchmark worker failed: {lines[-1] if lines else f'exit {proc.returncode}'}")
        data = json.loads(out_file.read_text())
    if "error" in data:
        raise ForgekitError.from_code(data["error"]["code"], data["error"]["message"])
    return data


def benchmark_artifact(artifact: str | os.PathLike[str], onnx_model: str | os.PathLike[str] | None = None, *,
                       runs: int = 20, warmup: int = 3, threads: int | None = None, memory: bool = True,
                       key_path: str | None = None, password: str | None = None,
                       rtol: float = 1e-3, atol: float = 1e-4, rpc_tracker: str | None = None,
                       rpc_key: str | None = None, rpc_host: str | None = None, rpc: Any = None,
                       peers: Sequence[str] = (), profile: bool = False,
                       inputs: Mapping[str, Any] | Sequence[Any] | None = None) -> BenchResult:
    """Time ``artifact`` (and ``onnx_model`` under onnxruntime, same threads, same inputs, same run).

    Parameters
    ----------
    artifact:
        Artifact directory from :func:`forgekit.compile_model`.
    onnx_model:
        The ONNX model it was compiled from: also timed with onnxruntime, and the outputs compared
        (``allclose(rtol, atol * max|reference|)``).
    runs, warmup:
        Timed and untimed runs per runtime.
    threads:
        Intra-op threads for both runtimes (default: the artifact's ``num-cores``, else all cores).
    memory:
        Also measure each runtime's peak RSS in its own short-lived process.
    key_path, password:
        For encrypted artifacts (see :class:`forgekit.runtime.Engine`).
    rpc_tracker, rpc_key, rpc_host:
        Time it on a remote device over TVM RPC instead: a tracker ``HOST:PORT`` and the key its boards
        registered with, or one server ``HOST:PORT`` (see :mod:`forgekit.devices.rpc_device`), or ``rpc``, a
        :class:`~forgekit.devices.rpc.RpcConfig`.  Outputs are still compared with onnxruntime on this machine;
        ``threads`` and ``memory`` do not apply.
    peers:
        Other runtimes to time on ``onnx_model`` in the same run (:data:`forgekit.evaluate.peers.PEERS`:
        ``openvino``, at f32 and at its default precision); their outputs are compared with onnxruntime's.
    profile:
        Also time every kernel in a separate worker (:mod:`forgekit.evaluate.profile`): ``extra["profile"]``
        lists them, heaviest first, with their share of the time and GFLOP/s.
    inputs:
        The arrays to time and compare on (by name, or a list in input order); by default seeded random ones
        within the values the artifact records (an index's table, an int8 model's calibration range).
    """
    from ..devices.rpc import RpcConfig
    from ..runtime.inputs import user_inputs

    if runs <= 0 or warmup < 0:
        raise UsageError(f"runs must be positive and warmup not negative (got runs={runs}, warmup={warmup}).")
    remote = rpc if rpc is not None else RpcConfig.from_options(rpc_tracker, rpc_key, rpc_host)
    library, meta_path = resolve(artifact)
    meta = read_metadata(meta_path) if meta_path else {}
    build = meta.get("build", {})
    from .compare import min_cosine_for
    from .peers import check_peers

    peers = check_peers(peers)
    if profile and remote is not None:
        raise UsageError("--profile times kernels on this machine: drop it for an RPC device.")
    if peers and (onnx_model is None or remote is not None):
        raise UsageError("--peer times other runtimes on the ONNX model on this machine: give --onnx MODEL, "
                         "and no RPC device.")
    if onnx_model is not None:
        from ..importer.load import load_onnx

        load_onnx(onnx_model)  # one-line error for a missing or broken model, before any worker starts
        onnx_model = str(Path(onnx_model).absolute())
    model = meta.get("model", {})
    given = None if inputs is None else user_inputs(model.get("inputs", []), inputs, model.get("dynamic"))
    if remote is not None:
        return benchmark_remote(artifact, remote, onnx_model, runs=runs, warmup=warmup, key_path=key_path,
                                password=password, rtol=rtol, atol=atol, inputs=given)
    if threads is None:
        threads = int(build.get("target", {}).get("num-cores") or len(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory(prefix="forgekit-bench-") as tmp:
        job = {"mode": "time", "artifact": str(Path(artifact).absolute()), "onnx": onnx_model, "threads": threads,
               "runs": runs, "warmup": warmup, "key_path": key_path, "rtol": rtol, "atol": atol,
               "min_cosine": min_cosine_for(meta.get("model", {})),
               "bf16": meta.get("model", {}).get("precision") == "bfloat16",
               "inputs_npz": str(Path(tmp) / "inputs.npz"), "peers": peers,
               "frozen": meta.get("model", {}).get("frozen")}
        if given is not None:
            import numpy as np

            np.savez(Path(tmp) / "given.npz", *given)
            job["given_npz"] = str(Path(tmp) / "given.npz")
        data = _spawn(job, threads, password)
        timings = data["timings"]
        kernels = _spawn({**job, "mode": "profile"}, threads, password)["kernels"] if profile else None
        fk = Timing(**timings["forgekit"])
        ort = Timing(**timings["onnxruntime"]) if "onnxruntime" in timings else None
        peer_timings = {k: Timing(**timings[k]) for k in data.get("peers") or {}}
        if memory:
            fk.peak_rss_mb = _spawn({**job, "mode": "rss:forgekit"}, threads, password)["peak_rss_mb"]
            if ort is not None:
                ort.peak_rss_mb = _spawn({**job, "mode": "rss:onnxruntime", "names": data["names"]},
                                         threads, password)["peak_rss_mb"]
            for label, timing in peer_timings.items():  # each peer precision in its own process too
                timing.peak_rss_mb = _spawn({**job, "mode": "rss:peer", "peer": data["peers"][label]["peer"],
                                             "label": label}, threads, password)["peak_rss_mb"]
    return BenchResult(artifact=str(artifact), threads=threads, forgekit=fk, onnxruntime=ort,
                       compile_seconds=build.get("compile_seconds"), max_abs_error=data.get("max_abs_error"),
                       output_scale=data.get("output_scale"), outputs_match=data.get("outputs_match"),
                       target=build.get("target_name"),
                       extra={**({"level": data["level"]} if data.get("level") else {}),
                              **({"min_cosine": data["min_cosine"]} if "min_cosine" in data else {}),
                              **({"noise_floor": data["noise_floor"]} if "noise_floor" in data else {}),
                              **({key: data[key] for key in ("reference_cosine", "bf16_reference_cosine")
                                  if key in data}),
                              **({"profile": kernels} if kernels is not None else {})},
                       peers=peer_timings,
                       peer_info=dict(data.get("peers") or {}))


def benchmark_remote(artifact: str | os.PathLike[str], config: Any, onnx_model: str | None = None, *, runs: int = 20,
                     warmup: int = 3, key_path: str | None = None, password: str | None = None, rtol: float = 1e-3,
                     atol: float = 1e-4, inputs: Sequence[Any] | None = None) -> BenchResult:
    """Time ``artifact`` on the RPC device of ``config`` (a :class:`forgekit.devices.rpc.RpcConfig`); onnxruntime
    here only provides the reference outputs (its speed on this machine says nothing about the board)."""
    from ..devices.rpc_device import RpcDevice
    from ..devices.staging import stage_artifact
    from ..errors import RPCError
    from ..runtime.inputs import example_inputs
    from ..runtime.stats import latency_stats
    from . import reference
    from .compare import compare_outputs, min_cosine_for

    library, meta_path = resolve(artifact)
    if meta_path is None:
        raise ArtifactError(f"'{artifact}' has no metadata.json: a remote bench needs the artifact directory.")
    meta = read_metadata(meta_path)
    build, model = meta.get("build", {}), meta.get("model", {})
    if device_of(meta) != {"os": "linux", "kind": "cpu"}:
        raise RPCError(f"'{artifact}' is a {build.get('family')} artifact: forgekit benches CPU Linux artifacts "
                       "over RPC.")
    if inputs is None:
        inputs = example_inputs(model.get("inputs", []), random=True, seed=0, ranges=model.get("dynamic"))
    expected = None
    if onnx_model:
        sess = reference.session(onnx_model)
        expected = reference.run(sess, reference.feeds(sess, [t["name"] for t in model.get("inputs", [])], inputs,
                                                       frozen=model.get("frozen")))
    with tempfile.TemporaryDirectory(prefix="forgekit-rpc-") as tmp:
        staged = stage_artifact(library, meta_path, Path(tmp) / "artifact", key_path, password)
        device = RpcDevice(config)
        run = device.run(staged, inputs, runs=runs, warmup=warmup)
    result = BenchResult(artifact=str(artifact), threads=0, forgekit=Timing(**latency_stats(run.infer_ms)),
                         compile_seconds=build.get("compile_seconds"), target=build.get("target_name"))
    result.extra["rpc"] = {"device": config.describe(), "remote_arch": run.where.rsplit("(", 1)[-1].rstrip(")")}
    if expected is not None:
        if len(run.outputs) != len(expected):
            raise RPCError(f"'{artifact}' returned {len(run.outputs)} output(s) on the device, onnxruntime "
                           f"{len(expected)}: is it the model the artifact was compiled from?")
        compared = compare_outputs(run.outputs, expected, rtol, atol, min_cosine_for(model))
        result.max_abs_error, result.output_scale = compared["max_abs_error"], compared["output_scale"]
        result.outputs_match = compared["outputs_match"]
    return result


MARKDOWN_HEADER = ("| model | target | threads | forgekit ms (median) | p90 | onnxruntime ms (median) | ratio | "
                   "forgekit MB | onnxruntime MB | compile s | max abs err (scale) | match |")


def markdown_row(name: str, r: BenchResult) -> str:
    """One markdown table row (see :data:`MARKDOWN_HEADER`)."""
    def f(v: float | None, fmt: str = ".2f") -> str:
        return "-" if v is None else format(v, fmt)

    ort = r.onnxruntime
    err = "-" if r.max_abs_error is None else f"{r.max_abs_error:.1e} ({r.output_scale:.2g})"
    match = "-" if r.outputs_match is None else ("yes" if r.outputs_match else "NO")
    return (f"| {name} | {r.target or '-'} | {r.threads} | {f(r.forgekit.median_ms)} | {f(r.forgekit.p90_ms)} | "
            f"{f(ort.median_ms if ort else None)} | {f(r.ratio)}x | {f(r.forgekit.peak_rss_mb, '.0f')} | "
            f"{f(ort.peak_rss_mb if ort else None, '.0f')} | {f(r.compile_seconds, '.1f')} | {err} | {match} |")


def markdown_table(rows: list[tuple[str, BenchResult]]) -> str:
    """A markdown table of several results."""
    sep = "|" + "---|" * (MARKDOWN_HEADER.count("|") - 1)
    return "\n".join([MARKDOWN_HEADER, sep, *(markdown_row(n, r) for n, r in rows)]) + "\n"
