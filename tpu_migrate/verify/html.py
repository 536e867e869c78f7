"""`verify --html`: the comparison as one self-contained page (tpu_migrate/html_page.py): per run of
the migrated program, the runs that differ first, its verdict; its steps beside the original's,
the first divergence marked; each rank's own figures at that step; and the lines both sides
printed, side by side (every rank's, where a launcher started several)."""

from __future__ import annotations

import html
import math

from tpu_migrate.html_page import inline, page
from tpu_migrate.verify import compare, printed

STYLE = """
td.number { text-align: right; font-family: ui-monospace, monospace; }
td.diverged, tr.diverged td { background: #fde0e0; font-weight: bold; }
td.line { font-family: ui-monospace, monospace; white-space: pre-wrap; }
.same { color: #2ca02c; } .differs { color: #d62728; }
"""
MOST_ROWS = 500  # steps (and printed lines) shown per run: the first divergence is always among them
MOST_RANK_COLUMNS = 8  # ranks whose printed lines get a column of their own


def render(script: str, side: str, reference: compare.Original, verdicts: list[compare.Verdict]) -> str:
    """`side`: what the original was compared with, and where it ran (command._migrated_side)."""
    noise = compare.noise_text(reference.floor)
    body = [f"<p>{html.escape(script)} (torch_xla on the CPU, 1 process) against {html.escape(side)}: "
            f"{html.escape(compare.counted(reference))}. "
            f"The original's own run-to-run noise: {html.escape(noise)}.</p>"]
    # The runs that differ first: they are what the reader came for.
    for verdict in sorted(verdicts, key=lambda v: v.divergence is None):
        body.append(_section(reference, verdict))
    return page(f"tpu-migrate verify: {script}", STYLE, "\n".join(body))


def _section(reference: compare.Original, verdict: compare.Verdict) -> str:
    original = reference.steps
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
    return head + table + _ranks_at(verdict, unit) + _printed_side_by_side(reference, verdict)


def _ranks_at(verdict: compare.Verdict, unit: str) -> str:
    """Each rank's own figures at the divergent step: which rank went its own way."""
    divergence = verdict.divergence
    if divergence is None or divergence.step is None or divergence.unit == "printed line":
        return ""
    rows = []
    for record in sorted(verdict.run.records, key=lambda r: r.get("rank", 0)):
        if "backward" in record:
            losses = record["backward"]
            figures = [losses[divergence.step] if divergence.step < len(losses) else None, None, None]
        elif record.get("step") == divergence.step:
            figures = [sum(record["losses"]) if record.get("losses") else None,
                       math.sqrt(record["grad_sq"] + record.get("grad_sq_sharded", 0.0)),
                       record["param_sum"] + record.get("param_sum_sharded", 0.0)]
        else:
            continue
        cells = "".join(f'<td class="number">{_value(value)}</td>' for value in figures)
        rows.append(f'<tr class="rank"><td class="number">{record.get("rank", 0)}</td>{cells}</tr>')
    if len(rows) < 2:
        return ""
    return (f"<h3>each rank at {html.escape(unit)} {divergence.step}</h3>"
            '<table class="ranks"><thead><tr><th>rank</th><th>loss</th><th>gradient norm<br>(its own and '
            "its shards)</th><th>parameters</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _printed_side_by_side(reference: compare.Original, verdict: compare.Verdict) -> str:
    """The lines with numbers that the original printed beside the migrated run's, by line
    number: rank 0's, and every other rank's that printed any; the line the verdict names is
    marked."""
    columns = [("original", {line.index: line.text for line in reference.printed})]
    if verdict.run.ranks:
        for rank, _first, text in verdict.run.ranks[:MOST_RANK_COLUMNS]:
            shown = {line.index: line.text for line in printed.lines(text)}
            if shown or rank == 0:
                columns.append((f"migrated, rank {rank}", shown))
    else:
        columns.append(("migrated", {line.index: line.text for line in printed.lines(verdict.run.printed)}))
    numbers = sorted(set().union(*(lines for _, lines in columns)))[:MOST_ROWS]
    if not numbers:
        return ""
    divergence = verdict.divergence
    marked = divergence.step if divergence is not None and divergence.unit == "printed line" else None
    rows = []
    for number in numbers:
        texts = "".join(f'<td class="line">{html.escape(lines.get(number, ""))}</td>' for _, lines in columns)
        css = "printed diverged" if marked == number else "printed"
        rows.append(f'<tr class="{css}"><td class="number">{number}</td>{texts}</tr>')
    header = "".join(f"<th>{html.escape(name)}</th>" for name, _ in columns)
    return ("<details" + (" open" if marked is not None else "") + "><summary>printed lines with numbers, side "
            f'by side</summary><table class="printed"><thead><tr><th>line</th>{header}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></details>")


def _value(value) -> str:
    return "&ndash;" if value is None else html.escape(compare.shown(value))
