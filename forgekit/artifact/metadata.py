"""Artifact metadata: rendered from the jinja2 templates shipped in ``forgekit.templates``.

Rendering uses ``StrictUndefined`` so a missing field fails loudly instead of writing an empty string,
and the result is parsed back as JSON before it is written, so a template edit can never ship
invalid metadata.  ``SOURCE_DATE_EPOCH`` pins the creation time for reproducible artifacts.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
from importlib import resources
from typing import Any

import jinja2


def _environment() -> jinja2.Environment:
    loader = jinja2.FunctionLoader(lambda name: resources.files("forgekit.templates").joinpath(name).read_text())
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False)


def render(template: str, **context: Any) -> str:
    """Render ``template`` (a file name in ``forgekit.templates``) with ``context``."""
    return _environment().get_template(template).render(**context)


def created_timestamp() -> str:
    """UTC creation time in ISO-8601, taken from ``SOURCE_DATE_EPOCH`` when it is set."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc) if epoch else _dt.datetime.now(_dt.timezone.utc)
    return when.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def versions() -> dict[str, str]:
    """Versions of forgekit and of the compiler stack that produced an artifact."""
    out = {}
    for key, dist in (("forgekit", "forgekit"), ("tvm", "apache-tvm"), ("tvm_ffi", "apache-tvm-ffi"), ("onnx", "onnx")):
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = "unknown"
    return out


def render_metadata(**context: Any) -> str:
    """Render ``metadata.json`` and check that it parses."""
    text = render("metadata.json.j2", **context)
    json.loads(text)
    return text
