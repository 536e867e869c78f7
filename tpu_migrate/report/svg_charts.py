"""Horizontal bar charts as inline SVG for the HTML reports: no script, no network, no font
files. Each bar's numbers are written beside it and in its tooltip (<title>), so the chart says
what the tables below it say, in a form a lead can plan from at a glance."""

from __future__ import annotations

import html

# The kinds of work a bar segment stands for, with their colours (the tables use the same words).
KINDS = {
    "auto": ("automatic", "#2ca02c"),
    "manual": ("manual", "#ff7f0e"),
    "design": ("manual, SPMD / FSDP", "#8c564b"),
    "before": ("references to torch_xla", "#7f7f7f"),
    "after": ("left for a person", "#ff7f0e"),
}
_LABEL_W, _BAR_W, _ROW_H, _PAD = 250, 460, 22, 6
_CHAR_W = 7  # px per character of the 12px label font, for cutting long labels


def bars(chart_id: str, title: str, rows: list[tuple[str, list[tuple[int, str]]]]) -> str:
    """A chart with one bar per row: `(label, [(count, kind), ...])`, segments stacked in order.
    Bars share one scale (the largest row's total)."""
    kinds = list(dict.fromkeys(kind for _, segments in rows for count, kind in segments if count))
    most = max((sum(count for count, _ in segments) for _, segments in rows), default=0) or 1
    legend_h = _ROW_H
    height = legend_h + len(rows) * _ROW_H + _PAD
    width = _LABEL_W + _BAR_W + 60
    parts = [f'<svg id="{chart_id}" class="chart" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}">',  # inline in HTML: no namespace needed
             f"<title>{html.escape(title)}</title>"]
    x = _LABEL_W
    for kind in kinds:  # the legend: what each colour is
        name, colour = KINDS[kind]
        parts.append(f'<rect x="{x}" y="4" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 14}" y="13" class="legend">{html.escape(name)}</text>')
        x += 24 + _CHAR_W * len(name)
    for index, (label, segments) in enumerate(rows):
        y = legend_h + index * _ROW_H
        total = sum(count for count, _ in segments)
        shown = label if len(label) * _CHAR_W <= _LABEL_W - 10 else "…" + label[-((_LABEL_W - 10) // _CHAR_W - 1):]
        parts.append(f'<g class="bar"><title>{html.escape(label)}: '
                     + html.escape(", ".join(f"{count} {KINDS[kind][0]}" for count, kind in segments))
                     + f'</title><text x="{_LABEL_W - 8}" y="{y + 15}" class="label">{html.escape(shown)}</text>')
        x = _LABEL_W
        for count, kind in segments:
            if not count:
                continue
            w = max(1.0, _BAR_W * count / most)
            parts.append(f'<rect class="seg-{kind}" x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{_ROW_H - 8}" '
                         f'fill="{KINDS[kind][1]}" data-count="{count}"/>')
            x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + 15}" class="count">{total}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


STYLE = """
svg.chart { display: block; margin: .4rem 0 1rem; max-width: 100%; height: auto; }
svg.chart text { font: 12px system-ui, sans-serif; fill: #222; }
svg.chart text.label { text-anchor: end; } svg.chart text.count { fill: #555; }
"""
