"""Run the import-coverage corpus through forgekit's product path and compare with onnxruntime.

    .venv/bin/python bench/import_corpus/run_corpus.py [--only PREFIX ...] [--keep-artifacts]
    .venv/bin/python bench/import_corpus/run_corpus.py --table

For every model of ``bench/models/import_corpus/manifest.json`` (built by ``make_corpus.py``), in its
own subprocess (a crash in one cannot take the run down):

1. **stock TVM**: plain ``tvm.relax.frontend.onnx.from_onnx(model, shape_dict=<full static input
   shapes>)``, import only, to record whether TVM 0.27 alone can import it;
2. **forgekit**: ``forgekit.from_onnx(path, shape_dict)`` -> ``.compile(target="host", opt_level=3)``
   -> ``forgekit.runtime.Engine(result.path).infer(feeds)``;
3. onnxruntime on the **original** model with the same seeded inputs.

Pass criterion per output: ``np.allclose(got, ref, rtol, atol)`` with rtol 1e-3 and
atol 1e-4 * max|ref|; quantized models (tag ``quantized``) use rtol 5e-2, atol 2e-2.
``max rel`` is max|got - ref| / max|ref| (maximum over outputs).

Results go to ``bench/results/import_corpus.json``; the markdown table is printed at the end
(``--table`` prints it from the JSON without running anything).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CORPUS = ROOT / "bench" / "models" / "import_corpus"
RESULTS = ROOT / "bench" / "results" / "import_corpus.json"
ARTIFACTS = CORPUS / "_artifacts"

FLOAT_TOL = {"rtol": 1e-3, "atol_rel": 1e-4}  # atol = atol_rel * max|ref|
QUANT_TOL = {"rtol": 5e-2, "atol": 2e-2}


def _one_line(exc: BaseException, limit: int = 300) -> str:
    from forgekit.importer.errors import one_line

    text = one_line(exc, limit)
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}"


# ----------------------------------------------------------------------------- inputs
def make_inputs(prepared, kind: str | None, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for the (statically pinned) prepared model.

    floats ~ N(0, 1); integers ~ U[0, 100); bool all True.  ``kind="bert"``: token ids in the
    vocabulary, an attention mask with the last 1/8 padded, zero token types.
    """
    from onnx import helper

    from forgekit.importer.prepare import graph_inputs, value_shape

    rng = np.random.default_rng(seed)
    out = {}
    for vi in graph_inputs(prepared):
        shape = value_shape(vi)
        if shape is None or not all(isinstance(d, int) for d in shape):
            raise ValueError(f"input {vi.name} is not static after pinning: {shape}")
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        if kind == "bert":
            if "ids" in vi.name and "type" not in vi.name:
                out[vi.name] = rng.integers(0, 30522, size=shape).astype(dt)
            elif "mask" in vi.name:
                m = np.ones(shape, dt)
                m[..., -shape[-1] // 8:] = 0
                out[vi.name] = m
            else:
                out[vi.name] = np.zeros(shape, dt)
        elif kind == "text" and dt.kind == "f" and len(shape) == 4:
            out[vi.name] = text_image(shape, rng).astype(dt)
        elif dt.kind == "f":
            out[vi.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            out[vi.name] = rng.integers(0, 100, size=shape).astype(dt)
        elif dt.kind == "b":
            out[vi.name] = np.ones(shape, dtype=dt)
        else:
            raise ValueError(f"unsupported input dtype {dt} for {vi.name}")
    return out


def text_image(shape, rng) -> np.ndarray:
    """A synthetic text line (dark strokes on light, noisy paper), normalised as PP-OCR expects; random
    noise would leave the detector's probability map all but zero."""
    n, c, h, w = shape
    img = np.full((n, c, h, w), 235.0, np.float32) + rng.normal(0, 6, (n, c, h, w)).astype(np.float32)
    for _ in range(max(3, w // 12)):
        y0, x0 = int(rng.integers(h // 4, max(h // 4 + 1, 3 * h // 4 - 2))), int(rng.integers(0, w - 4))
        img[:, :, y0:y0 + max(2, h // 6), x0:x0 + int(rng.integers(2, 6))] = 25.0
    return (img / 255.0 - 0.5) / 0.5


# ----------------------------------------------------------------------------- stock TVM
def stock_tvm_import(model, shape_dict) -> str:
    """'ok' or the one-line error of stock from_onnx (shape_dict with the full static input shapes)."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    from forgekit.importer.prepare import _pin_inputs, graph_inputs, value_shape

    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    with contextlib.suppress(Exception):
        _pin_inputs(pinned, shape_dict, 1, allow_dynamic=True)
    sd = {}
    for vi in graph_inputs(pinned):
        shp = value_shape(vi)
        if shp and all(isinstance(d, int) for d in shp):
            sd[vi.name] = shp
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from_onnx(model, shape_dict=sd)
        return "ok"
    except Exception as exc:  # noqa: BLE001
        return _one_line(exc, 160)


# ----------------------------------------------------------------------------- compare
def run_ort(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return [np.asarray(o) for o in sess.run(None, {k: v for k, v in feeds.items() if k in names})]


def compare(got: list[np.ndarray], ref: list[np.ndarray], quantized: bool, abs_atol: float | None = None) -> dict:
    """Per-output allclose; ``abs_atol`` (a manifest field) replaces the scaled atol for outputs such as
    probability maps whose maximum is itself tiny."""
    if len(got) != len(ref):
        return {"ok": False, "max_abs": float("inf"), "max_rel": float("inf"),
                "detail": f"{len(got)} outputs vs onnxruntime's {len(ref)}"}
    ok, max_abs, max_rel, detail = True, 0.0, 0.0, []
    for i, (g, r) in enumerate(zip(got, ref)):
        if g.shape != r.shape:
            return {"ok": False, "max_abs": float("inf"), "max_rel": float("inf"),
                    "detail": f"output {i}: shape {g.shape} vs onnxruntime's {r.shape}"}
        if r.size == 0:
            continue
        g64, r64 = g.astype(np.float64), r.astype(np.float64)
        diff = float(np.abs(g64 - r64).max())
        scale = float(np.abs(r64).max())
        rel = diff / scale if scale > 0 else diff
        max_abs, max_rel = max(max_abs, diff), max(max_rel, rel)
        if quantized:
            rtol, atol = QUANT_TOL["rtol"], QUANT_TOL["atol"]
        else:
            rtol, atol = FLOAT_TOL["rtol"], FLOAT_TOL["atol_rel"] * scale
        if abs_atol is not None:
            atol = max(atol, abs_atol)
        if not np.allclose(g64, r64, rtol=rtol, atol=atol):
            ok = False
            detail.append(f"output {i} max_abs={diff:.3g} (max|ref|={scale:.3g})")
    return {"ok": ok, "max_abs": max_abs, "max_rel": max_rel, "detail": "; ".join(detail)}


# ----------------------------------------------------------------------------- one model
def run_one(entry: dict, keep: bool) -> dict:
    import onnx

    import forgekit
    from forgekit.importer import prepare_onnx
    from forgekit.importer.converters import tvm_convert_map
    from forgekit.runtime import Engine

    path = CORPUS / entry["file"]
    model = onnx.load(str(path))
    shape_dict = entry.get("shape_dict")
    quantized = "quantized" in entry.get("tags", [])
    res: dict = {"name": entry["name"], "nodes": len(model.graph.node), "quantized": quantized}
    ops = collections.Counter(n.op_type for n in model.graph.node)
    tvm_map = tvm_convert_map()
    res["ops_needing_converters"] = sorted(o for o in ops if o not in tvm_map and o != "If")
    res["stock_tvm"] = stock_tvm_import(model, shape_dict)

    stage = "inputs"
    out_dir = ARTIFACTS / entry["name"]
    try:
        feeds = make_inputs(prepare_onnx(model, shape_dict, default_batch=1), entry.get("inputs"))
        stage = "onnxruntime"
        ref = run_ort(model, feeds)
        stage = "import"
        t = time.perf_counter()
        ir = forgekit.from_onnx(str(path), shape_dict)
        res["import_s"] = time.perf_counter() - t
        stage = "compile"
        t = time.perf_counter()
        result = ir.compile(target="host", output_path=str(out_dir), opt_level=3, force_overwrite=True)
        res["compile_s"] = time.perf_counter() - t
        stage = "load"
        engine = Engine(result.path)
        stage = "run"
        run_feeds = {n: feeds[n] for n in engine.input_names} if engine.input_names else feeds
        t = time.perf_counter()
        got = engine.infer(run_feeds)
        res["run_s"] = time.perf_counter() - t
        stage = "compare"
        res.update(compare(got, ref, quantized, entry.get("abs_atol")))
    except Exception as exc:  # noqa: BLE001 - a failure is a finding
        res.update(ok=False, stage=stage, error=f"{stage}: {_one_line(exc, 400)}")
    finally:
        if not keep:
            shutil.rmtree(out_dir, ignore_errors=True)
    return res


# ----------------------------------------------------------------------------- table
def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(results: dict, manifest: dict) -> str:
    rows = ["| model | exporter | ops of note (not in stock TVM) | stock TVM 0.27 `from_onnx` | forgekit result "
            "| max abs | max rel | compile s |",
            "|---|---|---|---|---|---|---|---|"]
    for name, r in sorted(results.items()):
        e = manifest.get(name, {})
        stock = r.get("stock_tvm", "-")
        if stock == "ok":
            stock = "imports"
        elif "not supported for frontend ONNX:" in stock:
            stock = "OpNotImplemented: " + stock.split("ONNX:", 1)[1].strip()[:60]
        else:
            stock = stock[:110]
        needs = ", ".join(r.get("ops_needing_converters", [])) or "-"
        if r.get("ok"):
            res = "OK"
        elif r.get("error"):
            res = "FAIL (" + r["error"][:160] + ")"
        else:
            res = "MISMATCH (" + r.get("detail", "")[:120] + ")"
        rows.append(f"| {name} | {e.get('exporter', '')} | {needs} | {stock.replace('|', '/')} | {res.replace('|', '/')} | "
                    f"{_fmt(r.get('max_abs'), '.2g')} | {_fmt(r.get('max_rel'), '.2g')} | {_fmt(r.get('compile_s'), '.1f')} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="*", help="model name prefixes")
    p.add_argument("--table", action="store_true", help="print the markdown table of the results JSON")
    p.add_argument("--keep-artifacts", action="store_true", help=f"keep compiled artifacts under {ARTIFACTS}")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per model")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    if a.table:
        print(table(json.loads(RESULTS.read_text()), manifest))
        return 0
    if a.one:
        print("RESULT " + json.dumps(run_one(manifest[a.one], a.keep_artifacts)), flush=True)
        return 0
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name, entry in sorted(manifest.items()):
        if a.only and not any(name.startswith(o) for o in a.only):
            continue
        if "export_error" in entry:
            results[name] = {"name": name, "ok": False, "error": "export: " + entry["export_error"]}
            print(f"{name:32s} EXPORT FAILED {entry['export_error']}", flush=True)
            continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name]
        if a.keep_artifacts:
            cmd.append("--keep-artifacts")
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, cwd=str(ROOT),
                                  env=dict(os.environ))
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if line:
                r = json.loads(line[-1][7:])
            else:
                tail = (proc.stderr.strip().splitlines() or [""])[-1]
                r = {"name": name, "ok": False, "error": f"crashed rc={proc.returncode}: {tail[:300]}"}
        except subprocess.TimeoutExpired:
            r = {"name": name, "ok": False, "error": f"timed out after {a.timeout} s"}
        r["total_s"] = time.perf_counter() - t
        results[name] = r
        status = "OK" if r.get("ok") else "FAIL"
        print(f"{name:32s} {status:4s} abs={_fmt(r.get('max_abs'), '.3g')} rel={_fmt(r.get('max_rel'), '.3g')} "
              f"compile={_fmt(r.get('compile_s'), '.1f')}s total={r['total_s']:.0f}s "
              f"stock={r.get('stock_tvm', '')[:70]} {r.get('error', '') or r.get('detail', '')}", flush=True)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True))
    print()
    print(table(results, manifest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
