"""Differential fuzzing of forgekit against onnxruntime on random valid ONNX graphs (fully offline).

    python bench/fuzz_onnx.py --seeds 0:2000 --levels 0,1,2,3,4 --target host --quantize-every 10 \
        --jobs 1 --out fuzz_report

Every seed gives one graph (:func:`forgekit.testing.generate`), compiled at every level and compared
with onnxruntime (:func:`forgekit.testing.differential.check`); every ``--quantize-every``-th seed is
also checked int8-quantized.  Failures are grouped by class; the first graph of each new bug class is
shrunk to a minimal model (:func:`forgekit.testing.shrink.shrink`) saved under ``OUT/models/``.
Writes ``OUT/report.json`` and ``OUT/report.md`` (rewritten as the run goes, so an interrupted run
still leaves a report) and prints a summary table.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import hashlib
import json
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402

from forgekit.testing import differential, generate  # noqa: E402
from forgekit.testing.differential import Failure, Result, Worker, check  # noqa: E402
from forgekit.testing.shrink import shrink  # noqa: E402


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        if ":" in part:
            lo, hi = part.split(":")
            seeds.extend(range(int(lo), int(hi)))
        elif part:
            seeds.append(int(part))
    return seeds


def slug(cls: str) -> str:
    """A short file name for a failure class, e.g. ``compile-error-L3-tvm-failed-to-compile-check``."""
    text = re.sub(r"[^a-z0-9]+", "-", cls.lower()).strip("-")
    return f"{text[:52].rstrip('-')}-{hashlib.sha1(cls.encode()).hexdigest()[:6]}"


def _any_level(cls: str) -> str:
    return re.sub(r":L\d", ":L#", cls)


class Campaign:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        (self.out / "models").mkdir(parents=True, exist_ok=True)
        self.levels = tuple(int(x) for x in args.levels.split(","))
        self.classes: dict[str, dict[str, Any]] = {}
        self.first: dict[str, tuple[onnx.ModelProto, Failure, bool, str]] = {}
        self.compile_seconds: dict[int, list[float]] = collections.defaultdict(list)
        self.graphs = self.quantized = self.bug_graphs = 0
        self.ops: collections.Counter[str] = collections.Counter()
        self.start = time.perf_counter()
        self.lock = threading.Lock()
        self.local = threading.local()

    def worker(self) -> Worker:
        if not hasattr(self.local, "worker"):
            self.local.worker = Worker()
        return self.local.worker

    def run_seed(self, seed: int) -> list[tuple[Any, Result]]:
        dynamic = {"auto": None, "always": True, "never": False}[self.args.dynamic]
        try:
            graph = generate(seed, dynamic=dynamic, max_nodes=self.args.max_nodes,
                             huge_ends=not self.args.no_huge_ends)
        except Exception as exc:
            res = Result(f"seed {seed}", self.levels)
            res.failures.append(Failure(f"generator-error:{differential.normalize(str(exc))}", None, repr(exc)))
            return [(None, res)]
        kw = dict(target=self.args.target, worker=self.worker(), timeout=self.args.timeout)
        results = [(graph, check(graph, self.levels, **kw))]
        weighted = {"Conv", "ConvTranspose", "MatMul", "Gemm"} & set(graph.op_types)
        imported = not any(f.cls.startswith(("import-error", "unsupported")) for f in results[0][1].failures)
        if self.args.quantize_every and seed % self.args.quantize_every == 0 and weighted and imported:
            results.append((graph, check(graph, self.levels, quantize=True, **kw)))
        return results

    def record(self, seed: int, results: list[tuple[Any, Result]]) -> None:
        with self.lock:
            self.graphs += 1
            self.bug_graphs += any(not res.ok for _, res in results)
            for graph, res in results:
                self.quantized += res.quantized
                if graph is not None and not res.quantized:
                    self.ops.update(graph.op_types)
                    for level, sec in res.compile_seconds.items():
                        self.compile_seconds[level].append(sec)
                for cls in res.all_classes:
                    fails = [f for f in res.failures if f.cls == cls]
                    entry = self.classes.setdefault(cls, {
                        "count": 0, "is_bug": fails[0].is_bug, "seeds": [], "levels": set(), "max_error": None,
                        "example": res.description, "message": fails[0].message[:600],
                        "traceback": fails[0].traceback[-2500:]})
                    entry["count"] += 1
                    if len(entry["seeds"]) < 20:
                        entry["seeds"].append(seed)
                    entry["levels"].update(f.level for f in fails if f.level is not None)
                    errs = [f.max_error for f in fails if f.max_error is not None]
                    if errs:
                        old = [] if entry["max_error"] is None else [entry["max_error"]]
                        entry["max_error"] = max(errs + old)
                    if cls not in self.first and graph is not None:
                        self.first[cls] = (graph.model, fails[0], res.quantized, graph.description)
                        tag = "BUG" if fails[0].is_bug else "info"
                        print(f"[{tag}] new class after {self.graphs} graphs: {cls}  (seed {seed})", flush=True)

    def shrink_all(self) -> None:
        shrunk: dict[str, tuple[onnx.ModelProto, Result]] = {}  # class with any level -> minimal model
        for cls, (model, failure, quantized, _desc) in self.first.items():
            entry = self.classes[cls]
            if not entry["is_bug"] or self.args.no_shrink or cls.startswith("generator-error"):
                continue
            onnx.save(model, self.out / "models" / f"{slug(cls)}.orig.onnx")
            levels = () if failure.level is None else (failure.level,)
            worker = self.worker()
            previous = shrunk.get(_any_level(cls))
            if previous is not None and cls in previous[1].all_classes:  # the same bug at another level
                entry.update(self.classes[previous[1].description]["shrunk"])
                print(f"{cls}: same minimal model as {previous[1].description}", flush=True)
                continue

            def still_fails(m: onnx.ModelProto, cls: str = cls, levels: tuple = levels) -> bool:
                return cls in check(m, levels, target=self.args.target, quantize=quantized, worker=worker,
                                    timeout=self.args.timeout).all_classes

            t0 = time.perf_counter()
            small = shrink(model, still_fails, max_checks=self.args.shrink_checks)
            final = check(small, self.levels, target=self.args.target, quantize=quantized, worker=worker)
            final.description = cls
            shrunk.setdefault(_any_level(cls), (small, final))
            path = self.out / "models" / f"{slug(cls)}.onnx"
            onnx.save(small, path)
            failing = {f.level for f in final.failures if _any_level(f.cls) == _any_level(cls) and f.level is not None}
            errors = [f.max_error for f in final.failures if f.max_error is not None]
            entry["shrunk"] = {
                "minimal_model": str(path), "original_nodes": len(model.graph.node),
                "minimal_nodes": len(small.graph.node), "minimal_ops": [n.op_type for n in small.graph.node],
                "minimal_failing_levels": sorted(failing), "minimal_classes": final.all_classes,
                "minimal_max_error": max(errors, default=None), "shrink_seconds": round(time.perf_counter() - t0, 1)}
            entry.update(entry["shrunk"])
            print(f"shrunk {cls}: {len(model.graph.node)} -> {len(small.graph.node)} nodes "
                  f"({' '.join(entry['minimal_ops'])})", flush=True)
            self.write()

    def summary(self) -> dict[str, Any]:
        comp = {str(lv): {"graphs": len(v), "mean_s": round(statistics.mean(v), 3),
                          "median_s": round(statistics.median(v), 3), "max_s": round(max(v), 3)}
                for lv, v in sorted(self.compile_seconds.items()) if v}
        classes = {k: {**{a: b for a, b in v.items() if a != "shrunk"}, "levels": sorted(v["levels"])}
                   for k, v in sorted(self.classes.items(), key=lambda kv: (-kv[1]["is_bug"], -kv[1]["count"]))}
        return {"config": {k: v for k, v in vars(self.args).items()}, "graphs": self.graphs,
                "quantized_checks": self.quantized, "seconds": round(time.perf_counter() - self.start, 1),
                "compile_seconds": comp, "bug_classes": sum(v["is_bug"] for v in classes.values()),
                "graphs_with_bugs": self.bug_graphs, "classes": classes, "op_coverage": dict(self.ops.most_common())}

    def write(self) -> dict[str, Any]:
        data = self.summary()
        (self.out / "report.json").write_text(json.dumps(data, indent=1, default=str))
        lines = ["# forgekit fuzz report\n", f"{data['graphs']} graphs ({data['quantized_checks']} quantized checks) "
                 f"in {data['seconds']} s; levels {self.args.levels}, target {self.args.target}.\n",
                 "| level | graphs | mean compile s | median | max |", "|---|---|---|---|---|"]
        lines += [f"| {lv} | {c['graphs']} | {c['mean_s']} | {c['median_s']} | {c['max_s']} |"
                  for lv, c in data["compile_seconds"].items()]
        lines += ["", "| class | bug | graphs | levels | max err | seeds | minimal model |",
                  "|---|---|---|---|---|---|---|"]
        for cls, c in data["classes"].items():
            err = "" if c["max_error"] is None else f"{c['max_error']:.3g}"
            model = c.get("minimal_model", "")
            nodes = f" ({c['minimal_nodes']} nodes: {' '.join(c['minimal_ops'])})" if model else ""
            lines.append(f"| `{cls}` | {'yes' if c['is_bug'] else 'no'} | {c['count']} | {c['levels']} | {err} | "
                         f"{', '.join(map(str, c['seeds'][:5]))} | {Path(model).name if model else ''}{nodes} |")
        (self.out / "report.md").write_text("\n".join(lines) + "\n")
        return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:200", help="ranges and values, e.g. 0:2000 or 5,9,100:200")
    ap.add_argument("--levels", default="0,1,2,3,4")
    ap.add_argument("--target", default="host", help="host (this CPU's features, the default) or llvm (portable)")
    ap.add_argument("--quantize-every", type=int, default=10, help="also check int8 every N-th seed (0: never)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default="fuzz_report")
    ap.add_argument("--max-nodes", type=int, default=8)
    ap.add_argument("--dynamic", choices=["auto", "always", "never"], default="auto")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per compile+run before 'timeout'")
    ap.add_argument("--no-huge-ends", action="store_true",
                    help="no INT32_MAX/INT64_MAX Slice bounds on symbolic dims (they used to hit an import bug, "
                         "fixed in importer/converters/slicing.py, that masked others)")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--shrink-checks", type=int, default=150)
    ap.add_argument("--time-limit", type=float, default=0, help="stop starting new seeds after this many seconds")
    args = ap.parse_args(argv)
    camp = Campaign(args)
    seeds = parse_seeds(args.seeds)
    with cf.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        pending: dict[cf.Future, int] = {}
        it = iter(seeds)
        for seed in it:
            pending[pool.submit(camp.run_seed, seed)] = seed
            if len(pending) >= args.jobs:
                break
        while pending:
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                camp.record(pending.pop(fut), fut.result())
                if camp.graphs % 25 == 0:
                    camp.write()
                    print(f"{camp.graphs} graphs, {time.perf_counter() - camp.start:.0f} s, "
                          f"{sum(c['is_bug'] for c in camp.classes.values())} bug classes", flush=True)
                if not args.time_limit or time.perf_counter() - camp.start < args.time_limit:
                    nxt = next(it, None)
                    if nxt is not None:
                        pending[pool.submit(camp.run_seed, nxt)] = nxt
    camp.shrink_all()
    data = camp.write()
    print(f"\n{data['graphs']} graphs in {data['seconds']} s -> {args.out}/report.md")
    print(f"{'graphs':>6}  {'bug':3}  {'levels':12}  class")
    for cls, c in data["classes"].items():
        print(f"{c['count']:>6}  {'yes' if c['is_bug'] else 'no':3}  {str(c['levels']):12}  {cls}")
    return 1 if data["bug_classes"] else 0


if __name__ == "__main__":
    sys.exit(main())
