"""`verify --html`: the comparison as one self-contained page (tpu_migrate/html_page.py): per run of
the migrated program its verdict, and its steps beside the original's, the first divergence
marked."""

from __future__ import annotations

import html

from tpu_migrate.html_page import inline, page
from tpu_migrate.verify import compare

STYLE = """
td.number { text-align: right; font-family: ui-monospace, monospace; }
td.diverged { background: #fde0e0; font-weight: bold; }
.same { color: #2ca02c; } .differs { color: #d62728; }
"""
MOST_ROWS = 500  # steps shown per run: the first divergence is always among them


def render(script: str, side: str, reference: compare.Original, verdicts: list[compare.Verdict]) -> str:
    """`side`: what the original was compared with, and where it ran (command._migrated_side)."""
    noise = compare.noise_text(reference.floor)
    body = [f"<p>{html.escape(script)} (torch_xla on the CPU, 1 process) against {html.escape(side)}: "
            f"{html.escape(compare.counted(reference))}. "
            f"The original's own run-to-run noise: {html.escape(noise)}.</p>"]
    for verdict in verdicts:
        body.append(_section(reference.steps, verdict))
    return page(f"tpu-migrate verify: {script}", STYLE, "\n".join(body))


def _section(original: list[compare.Step], verdict: compare.Verdict) -> str:
    divergence = verdict.divergence
    name = html.escape(verdict.run.name)
    unit = original[0].unit if original else "step"
    if divergence is None:
        head = (f'<h2>{name}: <span class="same">same</span></h2><p>{verdict.steps} {unit}s within the tolerance; '
                f"{html.escape(compare.printed_summary(verdict.printed))}.</p>")
    else:
        at = f"in its {divergence.unit} count" if divergence.step is None else \
            f"first at {divergence.unit} {divergence.step}, {html.escape(divergence.quantity)}"
        head = (f'<h2>{name}: <span class="differs">differs</span> {at}</h2>'
                f"<p>{_value(divergence.original)} (original) vs {_value(divergence.migrated)} (migrated, ranks "
                f"{', '.join(map(str, divergence.ranks))})</p>"
                + (f"<p>{compare.where_label(divergence)}: <code>{html.escape(divergence.where)}</code></p>"
                   if divergence.where else "")
                + f'<p class="explanation">likely: {inline(divergence.cause)}</p>')
    migrated = compare.steps(verdict.run)
    header = "".join(f"<th>{html.escape(q)}<br>original</th><th>{html.escape(q)}<br>migrated</th>"
                     for q in compare.QUANTITIES)
    rows = []
    for index in range(min(max(len(original), len(migrated)), MOST_ROWS)):
        a = original[index] if index < len(original) else None
        b = migrated[index] if index < len(migrated) else None
        cells = []
        for quantity in compare.QUANTITIES:
            marked = (divergence is not None and divergence.step == index and divergence.quantity == quantity)
            css = "number diverged" if marked else "number"
            for step in (a, b):
                value = None if step is None else step.figures[quantity]
                cells.append(f'<td class="{css}">{_value(value)}</td>')
        rows.append(f"<tr><td class=\"number\">{index}</td>{''.join(cells)}</tr>")
    table = (f'<table class="steps"><thead><tr><th>{unit}</th>{header}</tr></thead>'
             f"<tbody>{''.join(rows)}</tbody></table>")
    return head + table


def _value(value) -> str:
    return "&ndash;" if value is None else html.escape(compare.shown(value))
