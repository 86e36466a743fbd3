"""Import, compile, run every corpus model and compare with onnxruntime.

    .venv/bin/python run_corpus.py [--only PREFIX ...] [--dir corpus]

Each model runs in its own subprocess (a crash in one cannot take the run down).
For each model it also imports with plain ``tvm.relax.frontend.onnx.from_onnx``
(shape_dict only) to record whether stock TVM could do it.  Writes
``<dir>/results.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def bert_inputs(prepared):
    from importer.prepare import graph_inputs, value_shape

    rng = np.random.default_rng(0)
    out = {}
    for vi in graph_inputs(prepared):
        shp = value_shape(vi)
        if "ids" in vi.name and "type" not in vi.name:
            out[vi.name] = rng.integers(0, 30522, size=shp).astype(np.int64)
        elif "mask" in vi.name:
            m = np.ones(shp, np.int64)
            m[..., -shp[-1] // 8 :] = 0  # some padding
            out[vi.name] = m
        else:
            out[vi.name] = np.zeros(shp, np.int64)
    return out


def stock_tvm_import(model, shape_dict) -> str:
    """'ok' or the one-line error of stock from_onnx (shape_dict with full input shapes only)."""
    import contextlib
    import io
    import warnings

    from tvm.relax.frontend.onnx import from_onnx

    from importer.errors import one_line
    from importer.prepare import _pin_inputs

    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    try:
        _pin_inputs(m, shape_dict, 1, allow_dynamic=True)
    except Exception:  # noqa: BLE001
        pass
    sd = {}
    from importer.prepare import graph_inputs, value_shape

    for vi in graph_inputs(m):
        shp = value_shape(vi)
        if shp and all(isinstance(d, int) for d in shp):
            sd[vi.name] = shp
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from_onnx(model, shape_dict=sd)
        return "ok"
    except Exception as exc:  # noqa: BLE001
        return one_line(exc, 160)


def run_one(entry: dict, directory: Path) -> dict:
    import collections

    import onnx

    from importer import find_unsupported
    from importer.converters import tvm_convert_map
    from importer.verify import verify

    path = directory / entry["file"]
    model = onnx.load(str(path))
    shape_dict = entry.get("shape_dict")
    res = {"name": entry["name"], "nodes": len(model.graph.node)}
    ops = collections.Counter(n.op_type for n in model.graph.node)
    tvm_map = tvm_convert_map()
    res["ops_needing_converters"] = sorted(o for o in ops if o not in tvm_map and o != "If")
    res["stock_tvm"] = stock_tvm_import(model, shape_dict)
    res["preflight"] = [list(f) for f in find_unsupported(model, shape_dict)]
    input_fn = bert_inputs if entry.get("inputs") == "bert" else None
    t = time.perf_counter()
    try:
        r = verify(model, shape_dict, input_fn=input_fn, rtol=entry.get("rtol", 1e-3), atol=entry.get("atol", 1e-4))
        res.update(ok=r.ok, max_abs=r.max_abs, max_rel=r.max_rel, import_s=r.import_s, compile_s=r.compile_s,
                   run_s=r.run_s, detail=r.detail)
    except Exception as exc:  # noqa: BLE001
        from importer.errors import one_line

        res.update(ok=False, error=one_line(exc, 400))
    res["total_s"] = time.perf_counter() - t
    return res


def table(results: dict, manifest: dict) -> str:
    rows = ["| model | exporter | stock TVM 0.27 `from_onnx` | ops/patterns that needed work | result | max abs | max rel | compile s |",
            "|---|---|---|---|---|---|---|---|"]
    for name, r in sorted(results.items()):
        e = manifest.get(name, {})
        stock = r.get("stock_tvm", "")
        if stock == "ok":
            stock = "imports"
        elif "not supported for frontend ONNX:" in stock:
            stock = "OpNotImplemented: " + stock.split("ONNX:", 1)[1].strip()[:60]
        else:
            stock = stock[:90]
        needs = ", ".join(r.get("ops_needing_converters", [])) or "-"
        res = "OK" if r.get("ok") else ("export failed" if r.get("ok") is None else "FAIL: " + r.get("error", r.get("detail", ""))[:80])
        rows.append(
            f"| {name} | {e.get('exporter', '')} | {stock.replace('|', '/')} | {needs} | {res} | "
            f"{r.get('max_abs', float('nan')):.2g} | {r.get('max_rel', float('nan')):.2g} | {r.get('compile_s', float('nan')):.1f} |"
        )
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="*")
    p.add_argument("--dir", default=str(HERE / "corpus"))
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--table", action="store_true", help="print the markdown table of results.json")
    a = p.parse_args(argv)
    directory = Path(a.dir)
    if a.table:
        print(table(json.loads((directory / "results.json").read_text()), json.loads((directory / "manifest.json").read_text())))
        return 0
    manifest = json.loads((directory / "manifest.json").read_text())
    if a.one:
        print("RESULT " + json.dumps(run_one(manifest[a.one], directory)))
        return 0
    results_path = directory / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for name, entry in sorted(manifest.items()):
        if a.only and not any(name.startswith(o) for o in a.only):
            continue
        if "export_error" in entry:
            results[name] = {"name": name, "ok": None, "error": "export failed: " + entry["export_error"]}
            print(f"{name:36s} EXPORT FAILED")
            continue
        proc = subprocess.run([sys.executable, __file__, "--dir", str(directory), "--one", name],
                              capture_output=True, text=True, timeout=1800)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if line:
            r = json.loads(line[-1][7:])
        else:
            r = {"name": name, "ok": False, "error": f"crashed rc={proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
        results[name] = r
        status = "OK" if r.get("ok") else "FAIL"
        print(f"{name:36s} {status:4s} abs={r.get('max_abs', float('nan')):.3g} rel={r.get('max_rel', float('nan')):.3g} "
              f"stock={r.get('stock_tvm', '')[:70]} {r.get('error', '') or r.get('detail', '')}", flush=True)
    results_path.write_text(json.dumps(results, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
