"""Template contexts for ``MODEL_CARD.md`` and ``RELEASE_NOTES.md`` (rendered by ``forgekit publish``).

The templates render with ``StrictUndefined``, so every key they use is always present here: optional
facts (a CPU name, a latency measurement, an accuracy section) are ``None`` or empty, never missing.
Numbers are formatted here rather than in the templates so the text is identical on every machine.
Metadata is read defensively: fields that later forgekit versions add (``build.mcpu``,
``build.features``, a ``quantization``/``accuracy`` section) are used when present and skipped when not.
"""

from __future__ import annotations

from typing import Any

NOT_MEASURED = "not measured"


def _shape(shape: Any) -> str:
    if not isinstance(shape, (list, tuple)):
        return str(shape)
    return "x".join(str(d) for d in shape) or "scalar"


def _tensors(items: Any) -> list[dict[str, str]]:
    return [{"name": str(t.get("name", "?")), "shape": _shape(t.get("shape", [])), "dtype": str(t.get("dtype", "?"))}
            for t in items or []]


def _num(value: Any, fmt: str) -> str | None:
    return None if value is None else format(float(value), fmt)


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _pairs(mapping: Any) -> list[dict[str, str]]:
    """Sorted ``key: value`` rows of the scalar (or list) entries of a dict."""
    if not isinstance(mapping, dict):
        return []
    return [{"key": str(k), "value": _text(v)} for k, v in sorted(mapping.items())
            if v is not None and not isinstance(v, dict)]


def _target(build: dict[str, Any]) -> dict[str, Any]:
    target = build.get("target") if isinstance(build.get("target"), dict) else {}
    # mcpu/features are build-level fields in newer metadata; older artifacts only have them in the target.
    mcpu = build.get("mcpu") or target.get("mcpu")
    features = build.get("features") or target.get("mattr")
    return {
        "name": str(build.get("target_name", "unknown")),
        "family": str(build.get("family") or "unknown"),
        "triple": str(build.get("triple") or "unknown"),
        "arch": str(build.get("arch") or "unknown"),
        "mcpu": None if not mcpu else str(mcpu),
        "features": None if not features else _text(features),
        "opt_level": _text(build.get("opt_level", "unknown")),
        "float16": bool(build.get("float16", False)),
    }


def requirements(build: dict[str, Any]) -> dict[str, str]:
    """What a device needs to run the artifact: architecture, CPU features, device kind (the runtime checks)."""
    from ..artifact.layout import describe_device, device_of
    from ..runtime.cpu import describe_features

    arch = str(build.get("arch") or "unknown")
    features = [str(f) for f in build.get("cpu_features") or []]
    device = device_of({"build": build})
    runs_on = describe_features(arch, features) if features else arch
    levels = [str(v) for v in build.get("levels") or []]
    if len(levels) > 1:  # a portable artifact: the baseline is the requirement, better CPUs load better code
        runs_on += f" or better; levels {', '.join(levels)}, the best the CPU has is loaded"
    if device.get("kind") == "cuda":
        runs_on = f"{describe_device({'gpu_arch': build.get('gpu_arch'), **device})}, on a host of {runs_on}"
    elif device.get("kind") != "cpu":
        runs_on += f" + {device.get('kind')} {build.get('gpu_arch') or ''}".rstrip()
    return {"runs_on": runs_on, "os": str(device.get("os", "linux")),
            "features": ", ".join(features) if features else "not recorded (forgekit 0.1 artifact)"}


def run_it(model: dict[str, Any], bundle: str, encrypted: bool) -> dict[str, Any]:
    """The commands of the card's "Run it" section, with this model's inputs (symbolic dims shown as 1)."""
    inputs = model.get("inputs") or []
    arrays, feeds = [], []
    for i, t in enumerate(inputs):
        shape = tuple(d if isinstance(d, int) else 1 for d in t.get("shape", []))
        arrays.append(f"x{i} = np.zeros({shape!r}, np.{t.get('dtype', 'float32')})  # your {t.get('name')}")
        feeds.append(f'"{t.get("name")}": x{i}')
    password = ', password=os.environ["FORGEKIT_ENCRYPT_PASSWORD"]' if encrypted else ""
    return {"cli": f"forgekit run {bundle} --random", "engine": f'engine = Engine("{bundle}"{password})',
            "arrays": arrays, "infer": f"outputs = engine.infer({{{', '.join(feeds)}}})"}


def latency(bench: dict[str, Any] | None, source: str | None) -> dict[str, Any] | None:
    """The latency section from a ``forgekit bench --json`` result (None: not measured)."""
    if not bench:
        return None
    rows = []
    for runtime in ("forgekit", "onnxruntime"):
        timing = bench.get(runtime)
        if not timing:
            continue
        rows.append({
            "runtime": runtime, "runs": str(timing.get("runs", "?")),
            "median": _num(timing.get("median_ms"), ".3f"), "p90": _num(timing.get("p90_ms"), ".3f") or "-",
            "min": _num(timing.get("min_ms"), ".3f") or "-",
            "throughput": _num(timing.get("throughput_per_s"), ".1f") or "-",
            "peak_rss": _num(timing.get("peak_rss_mb"), ".0f") or "-",
        })
    match = bench.get("outputs_match")
    return {
        "source": source or "bench.json",
        "threads": str(bench.get("threads", "?")),
        "rows": rows,
        "ratio": _num(bench.get("ratio"), ".2f"),
        "outputs_match": None if match is None else ("yes" if match else "NO"),
        "max_abs_error": _num(bench.get("max_abs_error"), ".2e"),
    }


def _accuracy(meta: dict[str, Any]) -> list[dict[str, str]]:
    """Rows ``metric | fp32 | quantized | delta`` from ``accuracy`` (or ``quantization.accuracy``).

    Accepted shapes: ``{"top1": {"fp32": 0.76, "quantized": 0.75}}``, a list of
    ``{"metric": ..., "fp32": ..., "quantized": ...}``, or one such dict.
    """
    quant = meta.get("quantization") if isinstance(meta.get("quantization"), dict) else {}
    section = meta.get("accuracy", quant.get("accuracy"))
    if isinstance(section, dict) and "fp32" in section:
        section = [section]
    if isinstance(section, dict):
        section = [{"metric": k, **v} for k, v in sorted(section.items()) if isinstance(v, dict)]
    if not isinstance(section, list):
        return []
    rows = []
    for item in section:
        if not isinstance(item, dict) or "fp32" not in item:
            continue
        fp32, quantized = item.get("fp32"), item.get("quantized", item.get("value"))
        delta = item.get("delta")
        if delta is None and isinstance(fp32, (int, float)) and isinstance(quantized, (int, float)):
            delta = quantized - fp32
        rows.append({"metric": str(item.get("metric", "accuracy")), "fp32": _text(fp32),
                     "quantized": "-" if quantized is None else _text(quantized),
                     "delta": "-" if delta is None else (f"{delta:+.4g}" if isinstance(delta, (int, float)) else str(delta))})
    return rows


def card_context(meta: dict[str, Any], *, model_name: str, version: str, bundle: str, files: list[dict[str, Any]],
                 key_included: bool, key_file: str, bench: dict[str, Any] | None = None,
                 bench_source: str | None = None, chart: str | None = None,
                 device: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything ``MODEL_CARD.md.j2`` uses, from an artifact's ``metadata.json`` and optional bench JSON.

    ``files`` are the bundle's other files as ``{"name", "size", "sha256"}``; ``device`` the commands that run
    it on the device without Python (:func:`forgekit.release.device_runtime.device_commands`), if it ships
    the runtime.
    """
    model = meta.get("model", {})
    build = meta.get("build", {})
    library = meta.get("library", {})
    quant = meta.get("quantization")
    return {
        "model": {
            "name": model_name, "source": str(model.get("source") or "unknown"),
            "hash": str(model.get("hash", "unknown")), "fingerprint": str(model.get("fingerprint", "unknown")),
            "precision": str(model.get("precision", "unknown")), "layout": str(model.get("layout", "unknown")),
            "inputs": _tensors(model.get("inputs")), "outputs": _tensors(model.get("outputs")),
        },
        "version": version,
        "bundle": bundle,
        "artifact": {"uuid": str(meta.get("uuid", "unknown")), "created": str(meta.get("created", "unknown"))},
        "target": _target(build),
        "toolchain": _pairs(build.get("toolchain")),
        "versions": _pairs(meta.get("versions")),
        "encrypted": bool(library.get("encrypted", False)),
        "key_included": key_included,
        "key_file": key_file,
        "latency": latency(bench, bench_source),
        "chart": chart,
        "quantization": _pairs(quant),
        "accuracy": _accuracy(meta),
        "files": [{"name": f["name"], "size": str(f["size"]), "sha256": f["sha256"]} for f in files],
        "requirements": requirements(build),
        "run": run_it(model, bundle, bool(library.get("encrypted", False))),
        "device": device,
    }


def release_context(*, model_name: str, version: str, date: str, cards: list[dict[str, Any]],
                    archives: list[str]) -> dict[str, Any]:
    """Everything ``RELEASE_NOTES.md.j2`` uses: one row per bundle (``cards`` and ``archives`` in step)."""
    bundles = []
    for card, archive in zip(cards, archives):
        lat = card["latency"]
        fk = next((r for r in lat["rows"] if r["runtime"] == "forgekit"), None) if lat else None
        library = next((f["sha256"] for f in card["files"] if f["name"] == "model_library.so"), "unknown")
        bundles.append({
            "archive": archive, "target": card["target"]["name"], "precision": card["model"]["precision"],
            "encrypted": card["encrypted"], "key_included": card["key_included"],
            "latency": f"{fk['median']} ms" if fk and fk["median"] else NOT_MEASURED,
            "library_sha256": library,
        })
    # Toolchain versions: one row per component, listing every distinct value across the bundles.
    seen: dict[str, list[str]] = {}
    for card in cards:
        for row in card["versions"]:
            values = seen.setdefault(row["key"], [])
            if row["value"] not in values:
                values.append(row["value"])
    versions = [{"key": k, "value": " / ".join(v)} for k, v in sorted(seen.items())]
    return {"model": model_name, "version": version, "date": date, "bundles": bundles, "versions": versions,
            "any_encrypted": any(b["encrypted"] for b in bundles)}
