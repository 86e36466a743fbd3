"""A latency bar chart (SVG) for model cards, from a ``forgekit bench --json`` result.

Plain SVG text from the numbers (no plotting library: the card must render the same bytes everywhere,
for reproducible archives, and matplotlib would be a heavy dependency for four rectangles).  One bar per
runtime: median latency, with the p90 as a thin whisker; the value is printed at the end of each bar.
"""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape

CHART_FILE = "latency.svg"
COLOURS = {"forgekit": "#2b6cb0", "onnxruntime": "#9b9b9b", "openvino": "#6b46c1"}
WIDTH, LABEL, BAR, GAP, TOP = 560, 110, 22, 12, 34


def latency_svg(bench: dict[str, Any], title: str) -> str | None:
    """The chart for ``bench`` (None when it has no timing)."""
    rows = [(name, float(bench[name]["median_ms"]), float(bench[name].get("p90_ms") or bench[name]["median_ms"]))
            for name in ("forgekit", "onnxruntime", "openvino")
            if isinstance(bench.get(name), dict) and bench[name].get("median_ms")]
    if not rows:
        return None
    longest = max(p90 for _, _, p90 in rows) or 1.0
    scale = (WIDTH - LABEL - 90) / longest
    height = TOP + len(rows) * (BAR + GAP) + 18
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="13">',
        f'<title>{escape(title)}</title>',
        f'<text x="0" y="18" font-weight="bold">{escape(title)}</text>',
    ]
    for i, (name, median, p90) in enumerate(rows):
        y = TOP + i * (BAR + GAP)
        width, whisker = median * scale, p90 * scale
        parts += [
            f'<text x="{LABEL - 8}" y="{y + BAR * 0.7:.1f}" text-anchor="end">{escape(name)}</text>',
            f'<rect x="{LABEL}" y="{y}" width="{width:.1f}" height="{BAR}" fill="{COLOURS[name]}"/>',
            f'<line x1="{LABEL + width:.1f}" x2="{LABEL + whisker:.1f}" y1="{y + BAR / 2}" y2="{y + BAR / 2}" '
            'stroke="#333" stroke-width="1.5"/>',
            f'<text x="{LABEL + whisker + 6:.1f}" y="{y + BAR * 0.7:.1f}">{median:.3g} ms</text>',
        ]
    parts.append(f'<text x="{LABEL}" y="{height - 4}" fill="#555" font-size="11">median latency '
                 f'(whisker: p90), {escape(str(bench.get("threads", "?")))} thread(s); shorter is faster</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
