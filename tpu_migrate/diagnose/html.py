"""`diagnose --html FILE`: one self-contained page, no network and no external assets.

It holds the findings table and a per-step timeline drawn as inline SVG: a bar per step for its
wall time, marks for compiles, host syncs, dynamic shapes and fallbacks, and the warm-up steps
shaded; with the run's costs (costs.py), a dashed line at the steady-state median step time and
an outline on each step a finding slowed.
"""

from __future__ import annotations

import html

from tpu_migrate.diagnose.analysis import Finding, StepRecord, steps_text
from tpu_migrate.diagnose.costs import RunCosts
from tpu_migrate.diagnose.locations import relative, source_line, via_text
from tpu_migrate.html_page import inline, page

MARKS = (("compiles", "#d62728", "compile"), ("syncs", "#1f77b4", "host sync"),
         ("dynamic", "#9467bd", "dynamic shape"), ("fallbacks", "#ff7f0e", "fallback"))

STYLE = """
table { table-layout: fixed; }
th:nth-child(1) { width: 8rem; } th:nth-child(3), th:nth-child(4) { width: 4.5rem; } th:nth-child(2) { width: 30%; }
.kind-recompile { color: #d62728; font-weight: bold; } .kind-sync { color: #1f77b4; font-weight: bold; }
.kind-fallback { color: #ff7f0e; font-weight: bold; } .kind-dynamic-shape { color: #9467bd; font-weight: bold; }
.kind-recompile-limit, .kind-graph-break { color: #d62728; font-weight: bold; }
.kind-unsupported-op, .kind-tpu-incompatible { color: #8c564b; font-weight: bold; }
.legend span { margin-right: 1.2rem; }
code.source { display: block; white-space: pre-wrap; color: #555; }
.via { font-size: 12px; color: #777; }
"""


# More steps than this are drawn as this many bars of consecutive steps: one SVG element per
# step of a long run made pages of tens of MB that a browser could barely open.
MAX_BARS = 1000


def _bars(steps: list[StepRecord]) -> list[tuple[int, int, StepRecord]]:
    """(first step, last step, the bar's record): the mean wall time and the summed marks of
    consecutive steps when there are more than MAX_BARS."""
    size = -(-len(steps) // MAX_BARS)
    if size == 1:
        return [(s.index, s.index, s) for s in steps]
    bars = []
    for start in range(0, len(steps), size):
        group = steps[start : start + size]
        timed = [s.seconds for s in group if s.index > 0]  # step 0 has no wall time
        bars.append((group[0].index, group[-1].index, StepRecord(
            group[0].index, sum(timed) / len(timed) if timed else 0.0,
            *(sum(getattr(s, name) for s in group) for name, _, _ in MARKS))))
    return bars


def _label(first: int, last: int, record: StepRecord) -> str:
    if first == last:
        return f"step {first}: " + ("wall time n/a" if first == 0 else f"{record.seconds * 1000:.1f} ms")
    return f"steps {first}-{last}: {record.seconds * 1000:.1f} ms a step"


def _slowed(findings: list[Finding]) -> dict[int, list[str]]:
    """step -> the findings (file:line) that made it slower than steady state."""
    slowed: dict[int, list[str]] = {}
    for f in findings:
        for step in getattr(f.cost, "steps", ()):
            slowed.setdefault(step, []).append(f"{f.kind} at {relative(f.file)}:{f.line}")
    return slowed


def timeline_svg(steps: list[StepRecord], warmup_steps: int, median: float | None = None,
                 slowed: dict[int, list[str]] | None = None) -> str:
    width, height, left, bottom, top = 900, 260, 50, 40, 20
    if not steps:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="60" role="img" aria-label="no steps"><text x="10" y="30">no steps</text></svg>'
    plot_w, plot_h = width - left - 10, height - top - bottom
    slot = plot_w / len(steps)  # per step
    bars = _bars(steps)
    longest = max(record.seconds for _, _, record in bars) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="per-step timeline" id="timeline">']
    warm = min(warmup_steps, len(steps))
    if warm:
        parts.append(f'<rect class="warmup" x="{left}" y="{top}" width="{slot * warm:.1f}" height="{plot_h}" '
                     f'fill="#eeeeee"><title>warm-up ({warm} steps)</title></rect>')
    for first, last, s in bars:
        x, bar_w = left + first * slot, (last - first + 1) * slot
        bar_h = plot_h * 0.75 * (s.seconds / longest)
        label = _label(first, last, s)
        why = [name for step in range(first, last + 1) for name in (slowed or {}).get(step, ())]
        if why:
            parts.append(f'<rect class="slowed" data-step="{first}" x="{x + bar_w * 0.05:.1f}" y="{top + plot_h - bar_h - 3:.1f}" '
                         f'width="{max(bar_w * 0.9, 2):.1f}" height="{bar_h + 3:.1f}" fill="none" stroke="#d62728" '
                         f'stroke-width="1.5"><title>slowed by {html.escape("; ".join(sorted(set(why))))}</title></rect>')
        span = "" if first == last else f' data-last-step="{last}"'
        parts.append(
            f'<rect class="step" data-step="{first}"{span} x="{x + bar_w * 0.15:.1f}" y="{top + plot_h - bar_h:.1f}" '
            f'width="{max(bar_w * 0.7, 1):.1f}" height="{bar_h:.1f}" fill="#9aa7b1">'
            f'<title>{label}, {s.compiles} compile(s), {s.syncs} sync(s), '
            f'{s.dynamic} dynamic, {s.fallbacks} fallback(s)</title></rect>'
        )
        for row, (field, color, name) in enumerate(MARKS):
            count = getattr(s, field)
            if count:
                cy = top + 8 + row * 12
                where = f"step {first}" if first == last else f"steps {first}-{last}"
                parts.append(f'<circle class="mark {field}" cx="{x + bar_w / 2:.1f}" cy="{cy}" r="4" fill="{color}">'
                             f'<title>{where}: {count} {name}(s)</title></circle>')
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>')
    if median:
        y = top + plot_h - plot_h * 0.75 * (median / longest)
        parts.append(f'<line class="steady" x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                     f'stroke="#2ca02c" stroke-dasharray="6 3"><title>steady-state median step: '
                     f'{median * 1000:.1f} ms</title></line>')
    parts.append(f'<text x="{left}" y="{height - 12}" font-size="12">step 0</text>')
    parts.append(f'<text x="{left + plot_w - 60}" y="{height - 12}" font-size="12">step {len(steps) - 1}</text>')
    parts.append(f'<text x="4" y="{top + 12}" font-size="11">{longest * 1000:.0f} ms</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def render(script: str, steps: list[StepRecord], warmup_steps: int, findings: list[Finding], exit_code: int,
           backend: str = "xla", total_steps: int | None = None, costs: RunCosts | None = None,
           optimizer_steps: int = 0) -> str:
    """`steps`: the steps recorded one by one; `total_steps`: all the program ran (more past the
    event limit, where the timeline ends)."""
    total_steps = len(steps) if total_steps is None else max(total_steps, len(steps))
    rows = "\n".join(
        f'<tr class="finding"><td class="kind-{html.escape(f.kind)}">{html.escape(f.kind)}</td>'
        f"<td>{html.escape(relative(f.file))}:{f.line}{'' if f.rank is None else f' (rank {f.rank})'}"
        f'<code class="source">{html.escape(source_line(f.file, f.line))}</code>'
        + (f'<div class="via">{html.escape(via_text(f.via))}</div>' if f.via else "") + "</td>"
        f'<td class="count">{f.count}</td><td class="count">{f.first_step}</td>'
        f'<td>{inline(f.message)}<div class="explanation">{inline(f.explanation or "")}</div></td></tr>'
        for f in findings
    )
    table = (
        '<table id="findings"><thead><tr><th>kind</th><th>where</th><th>count</th><th>first step</th>'
        f"<th>what and what to do</th></tr></thead><tbody>{rows}</tbody></table>"
        if findings else '<p class="none" id="findings">No recompilation, graph break, host sync, dynamic '
                         'shape, CPU fallback, unsupported op or TorchTPU incompatibility after warm-up.</p>'
    )
    covered = ("" if total_steps == len(steps) else
               f" &middot; the timeline shows the first {len(steps)}: later steps were counted, not "
               "recorded one by one")
    legend = "".join(f'<span style="color:{color}">&#9679; {label}</span>' for _, color, label in MARKS)
    summary = "".join(f'<p class="costs">{html.escape(line)}</p>' for line in (costs.lines() if costs else ()))
    if costs is not None:
        legend += ('<span style="color:#2ca02c">- - steady-state median</span>'
                   '<span style="color:#d62728">&#9633; slowed by a finding</span>')
    return page(f"tpu-migrate diagnose: {relative(script)}", STYLE, f"""<p>backend {html.escape(backend)} &middot; {steps_text(total_steps, optimizer_steps)}{covered} &middot; {warmup_steps} warm-up steps (shaded) &middot; exit status {exit_code}</p>
{summary}
<h2>Findings</h2>
{table}
<h2>Per-step timeline</h2>
<p class="legend">bars: step wall time &middot; {legend}</p>
{timeline_svg(steps, warmup_steps, costs.steady_median if costs else None, _slowed(findings))}""")
