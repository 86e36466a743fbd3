"""Benchmark an artifact against onnxruntime on the same model, in the same run.

Speed is only meaningful as a ratio measured side by side on one machine at one moment (shared
machines drift by ±30 % between runs), so :func:`benchmark_artifact` times forgekit and onnxruntime in
one worker process, with equal thread counts, in alternating blocks of runs: a load swing then hits
both.  Between blocks the worker sleeps briefly, because both runtimes' thread pools spin for a while
after a call returns and would steal the other's cores.  Peak memory is measured in separate short
worker processes (one per runtime), since RSS cannot be attributed inside one process.

The worker is a fresh ``python -m forgekit.bench`` process: thread counts are fixed when a runtime's
thread pool starts, so they cannot be changed in the caller's process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ArtifactError, ForgekitError, NotAvailableError, UsageError

#: milliseconds of sleep between timing blocks (lets spinning worker threads go idle)
SETTLE_S = 0.05
BLOCK = 5


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

    @property
    def ratio(self) -> float | None:
        """forgekit median / onnxruntime median (below 1: forgekit is faster)."""
        return self.forgekit.median_ms / self.onnxruntime.median_ms if self.onnxruntime else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = self.ratio
        return data


def _stats(times: list[float]) -> dict[str, float]:
    import statistics

    times = sorted(times)
    n = len(times)
    median = statistics.median(times)
    return {"runs": n, "median_ms": median, "p90_ms": times[min(n - 1, int(round(0.9 * (n - 1))))],
            "mean_ms": statistics.fmean(times), "min_ms": times[0],
            "throughput_per_s": 1e3 / median if median > 0 else float("inf")}


def _ort_session(onnx_path: str, threads: int) -> Any:
    try:
        import onnxruntime as ort
    except ImportError:
        raise NotAvailableError("onnxruntime is not installed: pip install onnxruntime to compare against it.") from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])


def _feeds_for(session: Any, names: list[str], arrays: list[Any]) -> dict[str, Any]:
    """Match the artifact's inputs to onnxruntime's by name, else by position."""
    ort_names = [i.name for i in session.get_inputs()]
    if set(names) == set(ort_names):
        return dict(zip(names, arrays))
    if len(ort_names) != len(arrays):
        raise UsageError(f"The ONNX model has inputs {ort_names} but the artifact has {names}: is it the same model?")
    return dict(zip(ort_names, arrays))


def _peak_rss_mb() -> float:
    """This process's peak resident memory.  VmHWM, not getrusage: ru_maxrss survives fork+exec, so a
    worker started by a big parent would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    """Runs in the child process: time (and compare) or measure peak RSS, as ``job`` says."""
    import time

    import numpy as np

    from .runtime import Engine

    threads = job["threads"]
    mode = job["mode"]
    engine = None
    if mode in ("time", "rss:forgekit"):
        engine = Engine(job["artifact"], key_path=job.get("key_path"))
        arrays = engine.example_inputs(random=True, seed=0)
    session = None
    if job.get("onnx") and mode in ("time", "rss:onnxruntime"):
        session = _ort_session(job["onnx"], threads)
    if mode == "rss:onnxruntime":
        with np.load(job["inputs_npz"]) as saved:
            arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        feeds = _feeds_for(session, job["names"], arrays)
        for _ in range(3):
            session.run(None, feeds)
        return {"peak_rss_mb": _peak_rss_mb()}
    if mode == "rss:forgekit":
        for _ in range(3):
            engine.infer(*arrays)
        return {"peak_rss_mb": _peak_rss_mb()}

    runs, warmup = job["runs"], job["warmup"]
    import tvm_ffi

    prepared = [tvm_ffi.from_dlpack(a) for a in engine._arrange(tuple(arrays))]
    main = engine._main

    def run_forgekit() -> None:
        main(*prepared)

    fns = {"forgekit": run_forgekit}
    np.savez(job["inputs_npz"], *arrays)  # the same inputs for the memory probe of onnxruntime
    result: dict[str, Any] = {"names": engine.input_names}
    if session is not None:
        feeds = _feeds_for(session, engine.input_names, arrays)
        fns["onnxruntime"] = lambda: session.run(None, feeds)
        ours = engine.infer(*arrays)
        refs = session.run(None, feeds)
        err, scale, ok = 0.0, 0.0, True
        for out, ref in zip(ours, refs):
            ref = np.asarray(ref)
            out = np.asarray(out).reshape(ref.shape)
            if ref.dtype.kind != "f":
                ok &= bool(np.array_equal(out, ref))
                continue
            sc = float(np.max(np.abs(ref))) or 1.0
            e = float(np.max(np.abs(out.astype(np.float64) - ref)))
            ok &= bool(np.allclose(out, ref, rtol=job["rtol"], atol=job["atol"] * sc))
            if scale == 0.0 or e / sc >= err / scale:
                err, scale = e, sc
        result.update(max_abs_error=err, output_scale=scale, outputs_match=ok)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    while any(len(v) < runs for v in samples.values()):
        for key, fn in fns.items():
            time.sleep(SETTLE_S)
            for _ in range(min(BLOCK, runs - len(samples[key]))):
                start = time.perf_counter()
                fn()
                samples[key].append((time.perf_counter() - start) * 1e3)
    result["timings"] = {k: _stats(v) for k, v in samples.items()}
    return result


def _spawn(job: dict[str, Any], threads: int, password: str | None) -> dict[str, Any]:
    env = {**os.environ, "TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    if password is not None:
        from .crypto import DEFAULT_PASSWORD_ENV

        env[DEFAULT_PASSWORD_ENV] = password
    with tempfile.TemporaryDirectory(prefix="forgekit-bench-") as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_file.write_text(json.dumps(job))
        proc = subprocess.run([sys.executable, "-m", "forgekit.bench", str(job_file), str(out_file)],
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
                       rpc_key: str | None = None, rpc_host: str | None = None) -> BenchResult:
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
        registered with, or one server ``HOST:PORT`` (see :mod:`forgekit.remote_bench`).  Outputs are
        still compared with onnxruntime on this machine; ``threads`` and ``memory`` do not apply.
    """
    from .runtime import _resolve

    if runs <= 0 or warmup < 0:
        raise UsageError(f"runs must be positive and warmup not negative (got runs={runs}, warmup={warmup}).")
    from .rpc import RpcConfig

    remote = RpcConfig.from_options(rpc_tracker, rpc_key, rpc_host)
    if remote is not None:
        from .remote_bench import benchmark_remote

        if onnx_model is not None:
            from .frontend import load_onnx

            load_onnx(onnx_model)
        return benchmark_remote(artifact, remote, str(onnx_model) if onnx_model else None, runs=runs, warmup=warmup,
                                key_path=key_path, password=password, rtol=rtol, atol=atol)
    library, meta_path = _resolve(Path(artifact))
    meta = json.loads(meta_path.read_text()) if meta_path else {}
    build = meta.get("build", {})
    if threads is None:
        threads = int(build.get("target", {}).get("num-cores") or len(os.sched_getaffinity(0)))
    if onnx_model is not None:
        from .frontend import load_onnx

        load_onnx(onnx_model)  # one-line error for a missing or broken model, before any worker starts
        onnx_model = str(Path(onnx_model).absolute())
    with tempfile.TemporaryDirectory(prefix="forgekit-bench-") as tmp:
        job = {"mode": "time", "artifact": str(Path(artifact).absolute()), "onnx": onnx_model, "threads": threads,
               "runs": runs, "warmup": warmup, "key_path": key_path, "rtol": rtol, "atol": atol,
               "inputs_npz": str(Path(tmp) / "inputs.npz")}
        data = _spawn(job, threads, password)
        timings = data["timings"]
        fk = Timing(**timings["forgekit"])
        ort = Timing(**timings["onnxruntime"]) if "onnxruntime" in timings else None
        if memory:
            fk.peak_rss_mb = _spawn({**job, "mode": "rss:forgekit"}, threads, password)["peak_rss_mb"]
            if ort is not None:
                ort.peak_rss_mb = _spawn({**job, "mode": "rss:onnxruntime", "names": data["names"]},
                                         threads, password)["peak_rss_mb"]
    return BenchResult(artifact=str(artifact), threads=threads, forgekit=fk, onnxruntime=ort,
                       compile_seconds=build.get("compile_seconds"), max_abs_error=data.get("max_abs_error"),
                       output_scale=data.get("output_scale"), outputs_match=data.get("outputs_match"),
                       target=build.get("target_name"))


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


def _child_main(job_path: str, out_path: str) -> None:
    # tvm_ffi imports torch whenever it is installed (a symbol-conflict workaround), which adds ~250 MB
    # and a second of start-up to a process that never uses it; a deployed runtime has no torch, so
    # measure it that way.
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    job = json.loads(Path(job_path).read_text())
    try:
        result = _worker(job)
    except ForgekitError as exc:
        result = {"error": {"code": exc.exit_code, "message": str(exc)}}
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2])
