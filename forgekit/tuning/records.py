"""Tuning records: measured knob settings as JSON lines, in the artifact's folder and a shared cache.

Records are plain JSON lines (workload hash, rule, knobs, measured seconds), not MetaSchedule traces:
in TVM 0.27 a JSONDatabase could not replay the traces of these schedules when reloaded ("Check failed:
old_outputs.size() == new_outputs.size()"), while re-applying a rule with recorded knobs is exact and
cheap.  Workloads are keyed by their structure (names normalized), so the same conv shape in two models
shares its records.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..artifact.layout import RECORDS_DIR

#: the artifact's own records folder (resumed when the same output is compiled again with force)
ARTIFACT_RECORDS = RECORDS_DIR


def default_records_dir() -> Path:
    """The shared records cache: ``$FORGEKIT_RECORDS``, else ``$XDG_CACHE_HOME/forgekit/records``."""
    if os.environ.get("FORGEKIT_RECORDS"):
        return Path(os.environ["FORGEKIT_RECORDS"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forgekit" / "records"


def target_key(target: Any) -> str:
    """A folder name for a target: records measured for one CPU/core count never serve another."""
    data = json.dumps(_target_dict(target), sort_keys=True, default=str)
    kind = _target_dict(target).get("mcpu") or _target_dict(target).get("kind", "target")
    return f"{kind}-{hashlib.sha256(data.encode()).hexdigest()[:12]}"


def _target_dict(target: Any) -> dict[str, Any]:
    export = target.export() if hasattr(target, "export") else dict(target)
    return {k: v for k, v in dict(export).items() if k not in ("host", "tag", "keys") and not str(k).startswith("feature")}


class Records:
    """Measured knob settings in a folder: ``records.jsonl``, one JSON line per measurement
    (``workload``, ``rule``, ``knobs``, ``seconds`` or null when the setting was invalid).

    Append-only, so concurrent runs sharing a cache only ever add lines, and a partial line from a
    killed run is skipped when reading.
    """

    FILE = "records.jsonl"

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.entries: list[dict[str, Any]] = []
        path = self.folder / self.FILE
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(entry, dict) and "workload" in entry and "knobs" in entry:
                    self.entries.append(entry)

    def add(self, entry: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / self.FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
        self.entries.append(entry)

    def tried(self, key: str) -> set[str]:
        return {_knob_key(e["knobs"]) for e in self.entries if e["workload"] == key}

    def best(self) -> dict[str, dict[str, Any]]:
        """workload -> the fastest valid entry."""
        out: dict[str, dict[str, Any]] = {}
        for e in self.entries:
            if not e.get("seconds"):
                continue
            if e["workload"] not in out or min(e["seconds"]) < min(out[e["workload"]]["seconds"]):
                out[e["workload"]] = e
        return out

    def __len__(self) -> int:
        return len(self.entries)


class RecordSet:
    """Best records across several folders (the artifact's and the shared cache), for the build."""

    def __init__(self, folders: list[Path]) -> None:
        self.best: dict[str, dict[str, Any]] = {}
        for folder in folders:
            for key, entry in Records(folder).best().items():
                if key not in self.best or min(entry["seconds"]) < min(self.best[key]["seconds"]):
                    self.best[key] = entry

    def __len__(self) -> int:
        return len(self.best)

    def query(self, func: Any, target: Any) -> Any:
        """``func`` scheduled with its best record, or None (what the CPU backend asks for each kernel)."""
        return query_record(self, func, target)


def workload(func: Any) -> Any:
    """The PrimFunc as a one-function module named ``main`` (so the same kernel in another model,
    under another fused name, is the same workload)."""
    import tvm
    from tvm_ffi.serialization import from_json_graph_str, to_json_graph_str

    # A deep copy: TIR schedules update the functions they own in place, and the original is still
    # needed (the next candidate, the final build) — sharing it corrupted later candidates.  Through
    # tvm_ffi's own JSON, as backends/cpu/registry.py copies: tvm.ir.load_json also "upgrades" the text in
    # Python, which a copy made by this same TVM never needs.
    fresh = from_json_graph_str(to_json_graph_str(func))
    return tvm.IRModule({"main": fresh.with_attr("global_symbol", "main")})


def workload_key(func: Any) -> str:
    import tvm_ffi

    return f"{int(tvm_ffi.structural_hash(workload(func))) & 0xFFFFFFFFFFFFFFFF:016x}"


def query_record(records: RecordSet, func: Any, target: Any) -> Any:
    """``func`` scheduled with its best measured knobs, or None when it has no record."""
    from tvm import s_tir

    from ..backends.cpu.rules import RULES
    from ..targets.isa import isa_info

    entry = records.best.get(workload_key(func))
    if entry is None:
        return None
    rule = next((r for r in RULES if r.name == entry["rule"]), None)
    if rule is None:
        return None
    tinfo = isa_info(target)
    sch = s_tir.Schedule(workload(func))
    match = rule.matches(sch, tinfo)
    if match is None:
        return None
    rule.apply(sch, match, tinfo, entry["knobs"])
    name = func.attrs.get("global_symbol") if func.attrs is not None else None
    return sch.mod["main"].with_attr("global_symbol", name) if name is not None else sch.mod["main"]

def _knob_key(knobs: dict[str, Any]) -> str:
    return json.dumps(knobs, sort_keys=True)
