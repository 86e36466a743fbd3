"""Other runtimes timed next to forgekit in the same run, on the same inputs and threads: the runtimes people
would deploy instead.  onnxruntime is the reference and lives in :mod:`.reference`; this module holds the
peers that are only timed and compared (``forgekit bench --peer openvino``).

OpenVINO is timed twice: at f32 (``INFERENCE_PRECISION_HINT=f32``, the like-for-like comparison) and at
its default precision, which is bf16 on CPUs with AVX512_BF16 or AMX (this Zen 5 has it) and f32
elsewhere: what a user gets from ``compile_model(model, "CPU")``.  Like onnxruntime it is a benchmark
dependency only (``pip install openvino``), never a runtime one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ModelLoadError, NotAvailableError, UsageError
from ..log import first_line

PEERS = ("openvino",)


@dataclass
class PeerRun:
    """One way of running a peer: a zero-argument call (what is timed) and what it computed."""

    label: str  # "openvino-f32", "openvino-bf16", ...
    call: Callable[[], Any]
    outputs: list[np.ndarray]
    precision: str


def check_peers(peers: Sequence[str]) -> list[str]:
    """``peers`` de-duplicated, or a one-line UsageError naming the known ones."""
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise UsageError(f"Unknown peer runtime(s) {', '.join(unknown)}: choose from {', '.join(PEERS)}.")
    return list(dict.fromkeys(peers))


def prepare(peer: str, onnx_model: str, threads: int, arrays: Sequence[np.ndarray],
            label: str | None = None) -> list[PeerRun]:
    """Compile ``onnx_model`` with ``peer`` for ``threads`` threads and run it once on ``arrays``; ``label``:
    only the run of that label (``openvino-f32``; another ``openvino-*``: the default precision), as the peak
    memory probe needs one runtime per process."""
    if peer == "openvino":
        hints = ("f32", None) if label is None else ("f32",) if label == "openvino-f32" else (None,)
        return _openvino(onnx_model, threads, arrays, hints)
    raise UsageError(f"Unknown peer runtime {peer}: choose from {', '.join(PEERS)}.")


def _openvino(onnx_model: str, threads: int, arrays: Sequence[np.ndarray],
              hints: Sequence[str | None] = ("f32", None)) -> list[PeerRun]:
    try:
        import openvino as ov
    except ImportError:
        raise NotAvailableError("OpenVINO is not installed: pip install openvino (a benchmark peer).") from None
    core = ov.Core()
    runs = []
    for hint in hints:  # like for like, then what OpenVINO does by default on this CPU
        config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
        if hint:
            config["INFERENCE_PRECISION_HINT"] = hint
        try:
            compiled = core.compile_model(onnx_model, "CPU", config)
        except Exception as exc:  # OpenVINO raises RuntimeError with a long multi-line message
            raise ModelLoadError(f"OpenVINO cannot compile '{onnx_model}': {first_line(str(exc))}") from None
        precision = str(compiled.get_property("INFERENCE_PRECISION_HINT")).replace("<Type: '", "").rstrip("'>")
        precision = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(precision, precision)
        if hint is None and precision == "f32" and len(hints) > 1:
            continue  # the default is f32 on this CPU: already timed
        request = compiled.create_infer_request()
        feeds = {i: np.asarray(a, order="C") for i, a in enumerate(arrays)}
        result = request.infer(feeds)
        outputs = [np.array(result[out]) for out in compiled.outputs]
        runs.append(PeerRun(f"openvino-{precision}", lambda r=request, f=feeds: r.infer(f), outputs, precision))
    return runs
