"""The benchmark worker: a fresh process (``python -m forgekit.evaluate.bench_worker JOB RESULT``) that
times forgekit and onnxruntime side by side, or measures one runtime's peak memory.

A fresh process because thread counts are fixed when a runtime's thread pool starts, and because peak RSS
cannot be attributed to one runtime inside a process that holds both.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from ..memory import peak_rss_mb

#: seconds of sleep between timing blocks (lets spinning worker threads go idle)
SETTLE_S = 0.05
BLOCK = 5


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Time (and compare) or measure peak RSS, as ``job["mode"]`` says."""
    import numpy as np

    from ..runtime import Engine
    from ..runtime.stats import latency_stats
    from . import bf16_reference, reference
    from .compare import MIN_COSINE, compare_outputs

    mode = job["mode"]
    engine = session = None
    if mode in ("time", "rss:forgekit", "profile"):
        engine = Engine(job["artifact"], key_path=job.get("key_path"))
        # the caller's --input arrays (checked by bench.py), else seeded ones within the artifact's values
        arrays = _load(job["given_npz"]) if job.get("given_npz") else engine.example_inputs(random=True, seed=0)
    if job.get("onnx") and mode in ("time", "rss:onnxruntime"):
        session = reference.session(job["onnx"], job["threads"], exact=False)  # as people run it
    if mode in ("rss:onnxruntime", "rss:peer"):  # the inputs the timing worker saved
        arrays = _load(job["inputs_npz"])
    if mode == "rss:onnxruntime":
        feeds = reference.feeds(session, job["names"], arrays, frozen=job.get("frozen"))
        for _ in range(3):
            session.run(None, feeds)
        return {"peak_rss_mb": peak_rss_mb()}
    if mode == "rss:peer":  # one peer runtime (one precision) alone in this process
        from . import peers

        onnx_order = _load(_model_inputs(job))  # frozen inputs included: peers run the ONNX model
        for run in peers.prepare(job["peer"], job["onnx"], job["threads"], onnx_order, label=job["label"]):
            for _ in range(3):
                run.call()
        return {"peak_rss_mb": peak_rss_mb()}
    if mode == "profile":  # per-kernel times, in its own process: the hook must not slow the timed runs
        from .profile import profile_engine

        directory = Path(job["artifact"])
        rows = profile_engine(engine, arrays, runs=job["runs"], warmup=job["warmup"],
                              report_dir=directory if directory.is_dir() else directory.parent)
        return {"kernels": [r.to_dict() for r in rows]}
    if mode == "rss:forgekit":
        for _ in range(3):
            engine.infer(*arrays)
        return {"peak_rss_mb": peak_rss_mb()}

    fns = {"forgekit": engine.prepared_call(*arrays)}
    np.savez(job["inputs_npz"], *arrays)  # the same inputs for the memory probe of onnxruntime
    result: dict[str, Any] = {"names": engine.input_names, "level": engine.level}
    if session is not None:
        feeds = reference.feeds(session, engine.input_names, arrays, f"'{job['onnx']}'", job.get("frozen"))
        np.savez(_model_inputs(job), *feeds.values())  # in the model's order: the peers' memory probes
        fns["onnxruntime"] = lambda: session.run(None, feeds)
        expected = reference.run(reference.session(job["onnx"], job["threads"]), feeds)  # exact int8
        ours = engine.infer(*arrays)
        allowances: dict[str, list[float]] = {}  # the reference's own noise, measured once when first needed

        def judge(outputs: list[Any], min_cosine: float | None, bf16: bool = False) -> dict[str, Any]:
            """compare_outputs, then, for a mismatch (ill-conditioned, or wrong?), again with the reference's
            own noise: its floor for fp32 outputs, its cosine deficit for reduced-precision ones (and, for bf16,
            that of the reference with bf16-rounded operands: bf16_reference)."""
            judged = compare_outputs(outputs, expected, job["rtol"], job["atol"], min_cosine)
            if judged["outputs_match"]:
                return judged
            if min_cosine is None:
                if "floor" not in allowances:
                    allowances["floor"] = reference.fp32_noise(job["onnx"], feeds, expected)
                return compare_outputs(outputs, expected, job["rtol"], job["atol"], None, allowances["floor"])
            if "cosine" not in allowances:
                allowances["cosine"] = reference.cosine_noise(job["onnx"], feeds, expected)
            if bf16 and "bf16" not in allowances:
                allowances["bf16"] = bf16_reference.bf16_noise(job["onnx"], feeds, expected)
            return compare_outputs(outputs, expected, job["rtol"], job["atol"], min_cosine,
                                   cosine_noise=allowances["cosine"], bf16_noise=allowances["bf16"] if bf16 else None)

        result.update(judge(ours, job.get("min_cosine"), bool(job.get("bf16"))))
        from . import peers

        result["peers"] = {}
        for peer in job.get("peers") or []:  # timed in the same alternating blocks as forgekit and onnxruntime
            for run in peers.prepare(peer, job["onnx"], job["threads"], list(feeds.values())):
                fns[run.label] = run.call
                # a peer running bf16/f16 is judged as forgekit's bf16 artifacts are: by cosine
                reduced = MIN_COSINE.get({"bf16": "bfloat16", "f16": "float16"}.get(run.precision, ""))
                result["peers"][run.label] = {"precision": run.precision, "peer": peer,
                                              **judge(run.outputs, reduced, run.precision == "bf16")}
    runs, warmup = job["runs"], job["warmup"]
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    while any(len(v) < runs for v in samples.values()):
        for key, fn in fns.items():  # alternating blocks: a load swing hits both runtimes
            time.sleep(SETTLE_S)
            for _ in range(min(BLOCK, runs - len(samples[key]))):
                start = time.perf_counter()
                fn()
                samples[key].append((time.perf_counter() - start) * 1e3)
    result["timings"] = {k: latency_stats(v) for k, v in samples.items()}
    return result


def _model_inputs(job: dict[str, Any]) -> str:
    """Where the timing worker saves the ONNX model's feeds (the artifact's inputs and any frozen ones)."""
    return str(Path(job["inputs_npz"]).with_name("model_inputs.npz"))


def _load(npz: str) -> list[Any]:
    """The arrays ``numpy.savez(npz, *arrays)`` saved, in order."""
    import numpy as np

    with np.load(npz) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def main(job_path: str, out_path: str) -> None:
    # tvm_ffi imports torch whenever it is installed (a symbol-conflict workaround), which adds ~250 MB
    # and a second of start-up to a process that never uses it; a deployed runtime has no torch, so
    # measure it that way.
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    from ..errors import ForgekitError

    job = json.loads(Path(job_path).read_text())
    try:
        result = run_job(job)
    except ForgekitError as exc:
        result = {"error": {"code": exc.exit_code, "message": str(exc)}}
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
