"""Differential check of one ONNX model: forgekit at several opt levels against onnxruntime.

:func:`check` imports the model with ``forgekit.from_onnx`` (symbolic dims stay symbolic), builds
``get_inference_function`` at every level, runs it on the feeds and compares with onnxruntime.  The
import, compile and run happen in a child process (:class:`Worker`, reused across checks) so a
segfault in TVM becomes the failure class ``crash:<signal>`` instead of killing the caller.

Failure classes are stable strings (numbers and names normalized out of messages) so that equal bugs
group together across seeds::

    import-error:<ExceptionClass>:<message>     unsupported:<op> (not a bug)
    compile-error:L<level>:<message>            runtime-error:L<level>:<message>
    wrong-result:L<level>   wrong-shape:L<level>   wrong-dtype:L<level>
    crash:<signal>   timeout:L<level>   reference-error:<message> (onnxruntime refused: not a bug)

With ``quantize=True`` the classes get a ``quant:`` prefix and results are judged by the cosine
similarity with onnxruntime's fp32 outputs (>= 0.99).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .graph import GeneratedGraph, feeds_for
from .worker import Worker, shared_worker

COSINE_MIN = 0.99
#: an all-zero fp32 output (a padded row through a matmul) comes out of int8 near zero, not exactly: bias
#: correction adds each channel's mean rounding error to every row (seen: 1.6e-4)
QUANT_ZERO_TOL = 1e-2


@dataclass
class Failure:
    cls: str
    level: int | None = None
    message: str = ""
    max_error: float | None = None  # largest error / max|reference|, or the worst 1 - cosine (quantized)
    is_bug: bool = True
    traceback: str = ""


@dataclass
class Result:
    description: str
    levels: tuple[int, ...]
    failures: list[Failure] = field(default_factory=list)
    compile_seconds: dict[int, float] = field(default_factory=dict)
    quantized: bool = False

    @property
    def bugs(self) -> list[Failure]:
        return [f for f in self.failures if f.is_bug]

    @property
    def ok(self) -> bool:
        return not self.bugs

    @property
    def classes(self) -> list[str]:
        """Distinct failure classes that count as bugs, sorted."""
        return sorted({f.cls for f in self.bugs})

    @property
    def all_classes(self) -> list[str]:  # the non-bugs too
        return sorted({f.cls for f in self.failures})


# ---------------------------------------------------------------------------------------------- messages
def normalize(message: str, limit: int = 120) -> str:
    """One line with names, numbers and addresses replaced, so the same bug gives the same string."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    text = re.sub(r"TVM failed to compile for [^:]+:", "TVM failed to compile:", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "'_'", text)
    text = re.sub(r"0x[0-9a-fA-F]+", "0x_", text)
    text = re.sub(r"[A-Za-z_]*\d[\w.]*", lambda m: re.sub(r"\d+", "#", m.group()), text)
    text = re.sub(r"\s+", " ", text).strip().rstrip(".")
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


# ---------------------------------------------------------------------------------------------- reference
def reference(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """onnxruntime's outputs (no graph optimizations: the most literal reading of the model)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [[np.asarray(o) for o in sess.run(None, feed)] for feed in feeds]


def compare(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> tuple[str | None, float]:
    """(None | 'wrong-shape' | 'wrong-dtype' | 'wrong-result', error relative to max|ref|)."""
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape:
        return "wrong-shape", float("inf")
    if ref.size == 0:
        return None, 0.0
    if ref.dtype == np.bool_ or np.issubdtype(ref.dtype, np.integer):
        if out.dtype != ref.dtype and not (ref.dtype == np.bool_ and out.dtype in (np.uint8, np.int8)):
            return "wrong-dtype", float("inf")
        diff = np.abs(out.astype(np.int64) - ref.astype(np.int64))
        return ("wrong-result" if diff.max() else None), float(diff.max())
    if out.dtype != ref.dtype:
        return "wrong-dtype", float("inf")
    out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
    both_nan = np.isnan(out64) & np.isnan(ref64)
    same_inf = np.isinf(ref64) & (out64 == ref64)
    finite = np.isfinite(ref64)
    scale = float(np.max(np.abs(ref64[finite]))) if finite.any() else 1.0
    err = np.where(both_nan | same_inf, 0.0, np.abs(out64 - ref64))
    err = np.nan_to_num(err, nan=np.inf)
    bad = err > atol * scale + rtol * np.abs(np.nan_to_num(ref64, posinf=0, neginf=0))
    rel = float(err.max() / (scale or 1.0))
    return ("wrong-result" if bad.any() else None), rel


def cosine(out: np.ndarray, ref: np.ndarray) -> float:
    a, b = np.asarray(out, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    if a.shape != b.shape:
        return -1.0
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


# ---------------------------------------------------------------------------------------------- check
def _load(graph: Any) -> tuple[onnx.ModelProto, str, int]:
    if isinstance(graph, GeneratedGraph):
        return graph.model, graph.description, graph.seed
    if isinstance(graph, onnx.ModelProto):
        return graph, graph.graph.name, 0
    return onnx.load(str(graph)), Path(graph).name, 0


def _error_failure(prefix: str, kind: str, level: int | None, info: dict[str, Any]) -> Failure:
    if kind == "import-error" and info["ops"]:
        return Failure(f"{prefix}unsupported:{'+'.join(sorted(set(info['ops'])))}", None, info["message"], is_bug=False)
    if kind == "quantize-error" and info["type"] == "UsageError":  # e.g. nothing to quantize: not a bug
        return Failure(f"{prefix}not-applicable:{normalize(info['message'])}", None, info["message"], is_bug=False)
    msg = normalize(info["message"])
    where = f"L{level}:" if level is not None else f"{info['type']}:"
    if info.get("op_type") and kind == "import-error":
        where += f"{info['op_type']}:"
    return Failure(f"{prefix}{kind}:{where}{msg}", level, info["message"].strip()[:2000], traceback=info["traceback"])


def check(graph: Any, opt_levels: tuple[int, ...] = (0, 1, 2, 3, 4), target: str = "host", quantize: bool = False,
          rtol: float = 1e-3, atol: float = 1e-4, *, feeds: list[dict[str, np.ndarray]] | None = None,
          worker: Worker | None = None, timeout: float = 180.0) -> Result:
    """Compile ``graph`` (a :class:`GeneratedGraph`, ``onnx.ModelProto`` or path) at every level in
    ``opt_levels`` for ``target`` (default ``host``: this machine's CPU, its widest vectors and int8
    instructions, as users compile), run it and compare with onnxruntime.

    A value is wrong when ``|out - ref| > atol * max|ref| + rtol * |ref|``.  With ``quantize`` the model is
    calibrated on 16 random feeds, quantized (int8, per channel, percentile) and judged by the cosine
    similarity of each float output with onnxruntime's fp32 one (>= 0.99).
    """
    model, desc, seed = _load(graph)
    levels = tuple(opt_levels)
    result = Result(desc, levels, quantized=quantize)
    prefix = "quant:" if quantize else ""
    feeds = feeds if feeds is not None else feeds_for(model, seed=seed)
    try:
        refs = reference(model, feeds)
    except Exception as exc:
        result.failures.append(Failure(f"reference-error:{normalize(str(exc))}", None, str(exc)[:2000], is_bug=False))
        return result
    # 16 samples: with 4, the calibrated ranges of these tiny models miss the test feeds' extremes and
    # clipping alone drops the cosine below 0.99 (seen on a MatMul->Gemm model: 0.91 with 4, 1.0 with 32)
    calib = feeds_for(model, count=16, seed=seed + 1) if quantize else []
    worker = worker or shared_worker()
    pending = list(levels)
    first = True
    while first or pending:  # with no levels: import (and quantize) only
        first = False
        job = {"model": model.SerializeToString(), "feeds": feeds, "levels": pending, "target": target,
               "quantize": quantize, "calib": calib}
        messages = worker.run(job, timeout)
        done: set[int] = set()
        for msg in messages:
            kind = msg[0]
            if kind in ("import-error", "quantize-error", "harness-error"):
                result.failures.append(_error_failure(prefix, kind, None, msg[1]))
                return result
            if kind == "start":
                done.add(msg[1])
            elif kind in ("compile-error", "runtime-error"):
                result.failures.append(_error_failure(prefix, kind, msg[1], msg[2]))
                result.compile_seconds[msg[1]] = round(msg[3], 3)
            elif kind == "outputs":
                result.compile_seconds[msg[1]] = round(msg[3], 3)
                _judge(result, prefix, msg[1], msg[2], refs, quantize, rtol, atol)
            elif kind == "crash":
                result.failures.append(Failure(f"{prefix}crash:{msg[1]}", msg[2], f"child died ({msg[1]}) at level "
                                               f"{msg[2]}", traceback=msg[3]))
            elif kind == "timeout":
                result.failures.append(Failure(f"{prefix}timeout:L{msg[1]}", msg[1], f"no answer in {timeout:.0f}s"))
        pending = [lv for lv in pending if lv not in done]  # after a crash/timeout: the levels not reached
    return result


def _judge(result: Result, prefix: str, level: int, outs: list[list[np.ndarray]], refs: list[list[np.ndarray]],
           quantize: bool, rtol: float, atol: float) -> None:
    worst: dict[str, float] = {}
    for out, ref in zip(outs, refs):
        if len(out) != len(ref):
            worst["wrong-shape"] = float("inf")
            continue
        for o, r in zip(out, ref):
            if quantize:
                if not np.issubdtype(r.dtype, np.floating):
                    continue
                if o.shape != r.shape:
                    worst["wrong-shape"] = float("inf")
                    continue
                if not np.any(r):  # a cosine with zero is undefined: int8 must stay near zero on the outputs' scale
                    scale = max((float(np.abs(x).max(initial=0)) for x in ref), default=0.0) or 1.0
                    err = float(np.abs(o).max(initial=0)) / scale
                    if err > QUANT_ZERO_TOL:
                        worst["wrong-result"] = max(worst.get("wrong-result", 0.0), err)
                    continue
                cos = cosine(o, r)
                if cos < COSINE_MIN:
                    worst["wrong-result"] = max(worst.get("wrong-result", 0.0), 1.0 - cos)
                continue
            kind, err = compare(o, r, rtol, atol)
            if kind:
                worst[kind] = max(worst.get(kind, 0.0), err)
    for kind, err in worst.items():
        result.failures.append(Failure(f"{prefix}{kind}:L{level}", level, f"{kind} at level {level}", max_error=err))
