"""The numbers a program prints, compared line by line between the original and a migrated run.

A line's *template* is its text with each number replaced by `#`; the two outputs are aligned
on their templates (difflib), so a line printed by one side only (a device's name, a warning)
shifts nothing. In each aligned pair, the numbers are compared in order:

- within the tolerance, widened to one unit of the last digit printed (`0.1235` against
  `0.1234` is float rounding, not a difference; integers must be equal; the finer of the two
  when they differ, as a shortest repr such as `0.1` is exact); dates and clock times are
  not numbers;
- a time or a rate (by its label, `Rate=`, `took`, or its unit, `12.3s`, `it/s`), and any number
  the original's own two runs printed otherwise (the same seeded program: a difference is
  noise), is not compared, and counted as such;
- at more than one process, an integer that is the world size times the original's (or its
  inverse, or the world size itself where the original printed 1) counts per process or over
  the processes by design: it agrees at one process only, and is listed so, not a divergence
  (a float so, a loss at half the original's, was averaged twice: a divergence).

Rank 0's lines are compared with the original's as above. Every other rank's are read too
(across_ranks), for what the original, run at one process, cannot show by its values:

- a line the original printed from one process only (guards.py: under `xm.master_print` or a
  test of the rank) that a rank other than the first of its node prints too is a divergence:
  every rank prints what the original printed once (the first process of another node may print
  it: `xm.is_master_ordinal()` asks for the first of each host);
- a number the original printed from a reduction over the processes (what `xm.mesh_reduce` or
  `xm.all_reduce` returned, recorder.py, or a value the printing statement computed from what
  they returned: reductions.py, derived()) must be the same on every rank that prints it: ranks
  that print different values print a value of their own, the reduction dropped, even where
  rank 0's equals the one-process value. Where every rank prints the same and it differs from
  the original's, the migration reduced it over the processes' own data (each evaluates data of
  its own, so the reduction depends on the world size): agreeing at one process only, not a
  divergence (a float at the world size times the original's, or its inverse, still is one).
  Where rank 0 alone prints it, its value is all there is to compare.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field

# A number not at the end of a name or inside a dotted version (`step10`, `v1.2.3`); a unit
# (`12.3s`, `5ms`) or a sentence's full stop may follow it.
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\d_])(?!\.\d)|\b(?:nan|inf)\b")
# A date or a clock time (`2026-12-03`, `18:14:36.5`): when a line was printed, not a number it
# computed; two runs of the original a minute apart would not show it as noise.
CLOCK = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}:\d{2}(?::\d{2})?(?:[.,]\d+)?\b")
MOST_LINES = 20000  # lines read per run: the alignment is quadratic in the worst case
ALIKE = 0.75  # how alike two lines' templates must be to compare their numbers word by word
WORD = re.compile(r"#|[^\W\d]+|[^\w\s#]")
# A time or a rate, by its label before it (`Rate=`, `elapsed:`, `took`) or its unit after it
# (`12.3s`, `5 ms`, `it/s`): never compared, whatever two runs of the original printed (two
# epochs that took 12 s each would otherwise make 12 s the expected time).
TIMING_LABEL = re.compile(r"(?i)(?:rate|time|elapsed|took|duration|throughput|speed|latency|per[ _]sec(?:ond)?)"
                          r"\w*\s*[=:]?\s*$")
TIMING_UNIT = re.compile(r"(?i)^\s?(?:s|ms|us|µs|ns|sec|secs|seconds?|mins?|minutes?|h|hours?)\b|^\s?[\w ]*/s\b")


@dataclass(frozen=True)
class Number:
    value: float
    quantum: float  # one unit of its last printed digit; 0 for an integer
    position: int   # among its line's numbers
    timing: bool = False  # a time or a rate (TIMING_LABEL, TIMING_UNIT): never compared


@dataclass(frozen=True)
class Line:
    index: int      # 1-based, among the lines the process printed
    text: str
    template: str
    numbers: tuple[Number, ...]


@dataclass
class PrintedDivergence:
    line: int                 # the original's line number
    text: str                 # the original's line
    migrated_text: str
    original: float
    migrated: float
    kind: str = "value"       # "value" (rank 0's against the original's), "extra" (a once-printed line
    #                           printed by another rank too), "ranks" (a reduced value the ranks disagree on)
    rank: int = 0             # the rank that printed `migrated_text`


@dataclass
class Printed:
    """One migrated run's printed numbers against the original's."""
    compared: int = 0                 # numbers compared (and agreeing, up to the divergence)
    noisy: int = 0                    # numbers the original's two runs disagree on: not compared
    one_side: int = 0                 # lines with numbers that only one side printed
    divergence: PrintedDivergence | None = None
    world_only: list[dict] = field(default_factory=list)  # agree at one process only, with why
    largest_absolute: float = 0.0     # of the differences among the numbers compared
    largest_relative: float = 0.0


def lines(text: str) -> list[Line]:
    """The lines of `text` that hold a number."""
    out = []
    for index, raw in enumerate(text.splitlines()[:MOST_LINES], 1):
        raw = raw.rsplit("\r", 1)[-1].rstrip()  # a progress bar's last state
        timeless = CLOCK.sub("<time>", raw)
        numbers = tuple(_number(m.group(), k, _timing(timeless, m))
                        for k, m in enumerate(NUMBER.finditer(timeless)))
        if numbers:
            out.append(Line(index, raw, NUMBER.sub("#", timeless), numbers))
    return out


def noise(first: list[Line], second: list[Line]) -> set[tuple[int, int]]:
    """(line, position) of each number of the original's first run that its second run printed
    otherwise (beyond float rounding)."""
    noisy = {(line.index, x.position) for line in first for x in line.numbers if x.timing}
    for a, b in _pairs(first, second):
        for x, y in zip(a.numbers, b.numbers):
            if x.value != y.value and not (math.isnan(x.value) and math.isnan(y.value)):
                noisy.add((a.index, x.position))  # the same program, seeded: any difference is noise
    return noisy


def compare(original: list[Line], migrated: list[Line], noisy: set[tuple[int, int]], rtol: float, atol: float,
            world: int, agreed: set[tuple[int, int]] = frozenset(), lines_rtol: dict[int, float] | None = None
            ) -> Printed:
    """`agreed`: (line, position) of the original's reduced numbers that every rank printed alike
    (across_ranks): a different value there is a reduction over the processes' own data.
    `lines_rtol`: the user's tolerance for a line of the original's (its number), in place of `rtol`."""
    lines_rtol = lines_rtol or {}
    result = Printed()
    pairs = _pairs(original, migrated)
    result.one_side = len(original) + len(migrated) - 2 * len(pairs)
    for a, b in pairs:
        for x, y in zip(a.numbers, b.numbers):
            if (a.index, x.position) in noisy:
                result.noisy += 1
                continue
            if _close(x, y, lines_rtol.get(a.index, rtol), atol):
                result.compared += 1
                if not math.isnan(x.value):
                    result.largest_absolute = max(result.largest_absolute, abs(x.value - y.value))
                    result.largest_relative = max(result.largest_relative,
                                                  abs(x.value - y.value) / max(abs(x.value), 1e-12))
                continue
            why = _by_world_size(x, y, world)
            if why is None and (a.index, x.position) in agreed and not world_scale(x.value, y.value, world, 1e-3):
                why = (f"reduced over the processes in the original, and every rank prints the same: a reduction "
                       f"over the {world} processes' own data (by design where each evaluates data of its own)")
            if why is not None:
                result.world_only.append({"line": a.index, "original": a.text, "migrated": b.text,
                                          "values": [x.value, y.value], "why": why})
                continue
            result.divergence = PrintedDivergence(a.index, a.text, b.text, x.value, y.value)
            return result
    return result


def reduced(original: list[Line], values: list[float]) -> set[tuple[int, int]]:
    """(line, position) of each number the original printed that a reduction returned (to its
    printed digits)."""
    out = set()
    for line in original:
        for x in line.numbers:
            if not x.timing and any(math.isclose(x.value, v, rel_tol=1e-9, abs_tol=x.quantum * (1 + 1e-9))
                                    for v in values):
                out.add((line.index, x.position))
    return out


def derived(original: list[Line], parts: dict[int, list | None]) -> set[tuple[int, int]]:
    """(line, position) of each number the original printed from a value computed from reduced
    ones (reductions.py): per line, its parts (literal text, and values reduced or not) placed on
    the printed text; where they are unknown (None) or do not fit it, the line's numbers with a
    decimal point (a ratio, a mean: an integer beside them is a count or an epoch)."""
    out = set()
    for line in original:
        if line.index not in parts:
            continue
        timeless = CLOCK.sub("<time>", line.text)
        spans = _reduced_spans(timeless, parts[line.index])
        for k, match in enumerate(NUMBER.finditer(timeless)):
            number = line.numbers[k] if k < len(line.numbers) else None
            if number is None or number.timing:
                continue
            inside = any(start <= match.start() < end for start, end in spans) if spans is not None \
                else number.quantum != 0
            if inside:
                out.add((line.index, number.position))
    return out


def _reduced_spans(text: str, parts: list | None) -> list[tuple[int, int]] | None:
    """Where in the printed text the reduced values stand, or None where the parts do not fit it."""
    if not parts:
        return None
    pattern, groups = "", []
    for k, (kind, value) in enumerate(parts):
        if kind == "lit":
            pattern += re.escape(value.rstrip() if k == len(parts) - 1 else value)
        else:
            pattern += "(.*?)"
            groups.append(bool(value))
    match = re.fullmatch(pattern + r"\s*", text, re.DOTALL)
    if match is None:
        return None
    return [match.span(g + 1) for g, reduced in enumerate(groups) if reduced]


def across_ranks(original: list[Line], once: set[int], reduced_numbers: set[tuple[int, int]],
                 ranks: list[tuple[int, bool, list[Line]]], rtol: float, atol: float
                 ) -> tuple[PrintedDivergence | None, set[tuple[int, int]]]:
    """What every rank printed, against the original (see the module's text): the first line
    printed by too many processes or holding a reduced number the ranks disagree on, and the
    reduced numbers they agree on."""
    printers: dict[int, list[tuple[int, bool, Line, Line]]] = {}
    for rank, first, lines in ranks:
        for a, b in _pairs(original, lines):
            printers.setdefault(a.index, []).append((rank, first, a, b))
    agreed = set()
    for index, printed in sorted(printers.items()):
        extra = [(rank, a, b) for rank, first, a, b in printed if not first]
        if index in once and extra:
            rank, a, b = extra[0]
            return PrintedDivergence(a.index, a.text, b.text, 1, len(printed), "extra", rank), set()
        # Each rank's number at each of the original's positions (a line alike, not the same, is cut
        # to the numbers at the same words: _aligned).
        by_position: dict[int, list[tuple[int, Number, Line]]] = {}
        for rank, _, a, b in printed:
            for x, y in zip(a.numbers, b.numbers):
                if (index, x.position) in reduced_numbers:
                    by_position.setdefault(x.position, []).append((rank, y, b))
        for position, seen in sorted(by_position.items()):
            if len(seen) < 2:
                continue
            _, y0, b0 = seen[0]
            for rank, y, b in seen[1:]:
                if not _close(y0, y, rtol, atol):
                    return PrintedDivergence(index, printed[0][2].text, b.text, y0.value, y.value, "ranks",
                                             rank), set()
            agreed.add((index, position))
    return None, agreed


def _pairs(first: list[Line], second: list[Line]) -> list[tuple[Line, Line]]:
    """Lines of the same template paired in order; between them, lines whose texts are alike
    (`Device=xla:0/0 ... Loss=#` against `Device=cpu/0 ... Loss=#`), their numbers paired word by
    word (_aligned)."""
    matcher = difflib.SequenceMatcher(None, [line.template for line in first],
                                      [line.template for line in second], autojunk=False)
    pairs = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs += zip(first[i1:i2], second[j1:j2])
        elif tag == "replace":
            pairs += _alike(first[i1:i2], second[j1:j2])
    return pairs


def _alike(first: list[Line], second: list[Line]) -> list[tuple[Line, Line]]:
    pairs, start = [], 0
    for a in first:
        for k in range(start, len(second)):
            matcher = difflib.SequenceMatcher(None, a.template, second[k].template, autojunk=False)
            # The cheap upper bounds first: most candidates fail them, and ratio() is quadratic.
            if matcher.real_quick_ratio() >= ALIKE and matcher.quick_ratio() >= ALIKE and matcher.ratio() >= ALIKE:
                pairs.append(_aligned(a, second[k]))
                start = k + 1
                break
    return pairs


def _aligned(a: Line, b: Line) -> tuple[Line, Line]:
    """The two lines cut to the numbers that stand at the same words of both."""
    words_a, words_b = WORD.findall(a.template), WORD.findall(b.template)
    numbers_a, numbers_b = _positions(words_a), _positions(words_b)
    kept_a, kept_b = [], []
    matcher = difflib.SequenceMatcher(None, words_a, words_b, autojunk=False)
    for i, j, size in matcher.get_matching_blocks():
        for k in range(size):
            if words_a[i + k] == "#":
                kept_a.append(a.numbers[numbers_a[i + k]])
                kept_b.append(b.numbers[numbers_b[j + k]])
    return Line(a.index, a.text, a.template, tuple(kept_a)), Line(b.index, b.text, b.template, tuple(kept_b))


def _positions(words: list[str]) -> dict[int, int]:
    """word index -> number index, for the `#` words."""
    hashes = [i for i, word in enumerate(words) if word == "#"]
    return {i: n for n, i in enumerate(hashes)}


def _number(token: str, position: int, timing: bool) -> Number:
    value = float(token)
    mantissa, _, exponent = token.lower().partition("e")
    if "." not in mantissa and token.lower() not in ("nan", "inf"):
        return Number(value, 0.0 if not exponent else 10.0 ** int(exponent), position, timing)
    decimals = len(mantissa.partition(".")[2])
    return Number(value, 10.0 ** (int(exponent or 0) - decimals), position, timing)


def _timing(line: str, match: re.Match) -> bool:
    return bool(TIMING_LABEL.search(line[max(0, match.start() - 24):match.start()])
                or TIMING_UNIT.match(line[match.end():match.end() + 16]))


def _close(x: Number, y: Number, rtol: float, atol: float) -> bool:
    if math.isnan(x.value) or math.isnan(y.value):
        return math.isnan(x.value) and math.isnan(y.value)
    # One unit of the finer last digit (plus a hair for the float arithmetic of it): both sides
    # print with one format, and a shortest repr (`0.1`) is exact, not rounded to one digit.
    quantum = min(x.quantum, y.quantum) * (1 + 1e-9)
    return math.isclose(x.value, y.value, rel_tol=rtol, abs_tol=max(atol, quantum))


def _by_world_size(x: Number, y: Number, world: int) -> str | None:
    """Why a count may differ at `world` processes by design, or None. Only integers: a float
    (a loss) at 1/N of the original's was averaged twice, not counted per process."""
    original, migrated = x.value, y.value
    if world == 1 or original == 0 or x.quantum or y.quantum or not (original.is_integer() and migrated.is_integer()):
        return None
    if original == 1 and migrated == world:
        return f"the world size itself ({world})"
    scale = world_scale(original, migrated, world, 1e-3)
    if scale == "times":
        return f"{world} times the original's: a total over the {world} processes (or a per-process figure scaled)"
    if scale == "fraction":
        return f"1/{world} of the original's: a count per process, each holding 1/{world} of the work"
    return None


def world_scale(original: float, migrated: float, world: int, rel_tol: float) -> str | None:
    """"times" where `migrated` is the world size times `original`, "fraction" where it is 1/world
    of it, else None (also at one process, where neither means anything)."""
    if world == 1 or not original:
        return None
    ratio = migrated / original
    if math.isclose(ratio, world, rel_tol=rel_tol):
        return "times"
    if math.isclose(ratio, 1 / world, rel_tol=rel_tol):
        return "fraction"
    return None
