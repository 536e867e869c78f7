"""The code that can explain a divergence, not only the line that stepped the optimizer: with
`verify --against`, the port's lines that differ from tpu-migrate's own migration of the original
(what the rewrite produces mechanically is left out); without it, the rewrite's own hunks (the
original's lines it converted). Those that feed the quantity that diverged first (a static
backward slice from it: program_slice.py) are named first; where none does, the report says so."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from tpu_migrate.verify.program_slice import Program

SHOWN = 3  # hunks named; the rest counted
LONGEST = 120  # characters of a hunk's code shown


def program_file(path: Path, module: str | None, imports: tuple[Path, ...]) -> Path | None:
    """The file a run executes: the script, or the module's file in its tree."""
    if module is None:
        return path
    relative = Path(*module.split("."))
    for folder in imports or (path,):
        for candidate in ((folder / relative).with_suffix(".py"), folder / relative / "__main__.py"):
            if candidate.is_file():
                return candidate
    return None


@dataclass(frozen=True)
class Hunk:
    """Lines of one file (before) that another (after) has otherwise, 0-based ranges as difflib's."""
    first: tuple[int, int]   # [start, end) in before
    second: tuple[int, int]  # [start, end) in after
    before: str
    after: str


@dataclass(frozen=True)
class Sources:
    """The two files told apart: the mechanical migration and the port (`--against`), or the
    original and its migration (`converted`: the rewrite's own hunks)."""
    before: str
    after: str
    before_name: str
    after_name: str
    converted: bool = False

    @classmethod
    def read(cls, before: Path, after: Path, converted: bool = False) -> Sources | None:
        try:
            return cls(before.read_text(encoding="utf-8"), after.read_text(encoding="utf-8"), before.name, after.name,
                       converted)
        except (OSError, UnicodeDecodeError):
            return None


def hunks(before: str, after: str) -> list[Hunk]:
    """Where `after` differs from `before`, blank lines, comments and indentation aside."""
    ours, theirs = before.splitlines(), after.splitlines()
    out = []
    matcher = difflib.SequenceMatcher(None, [_code(line) for line in ours], [_code(line) for line in theirs],
                                      autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        first, second = _joined(ours[i1:i2]), _joined(theirs[j1:j2])
        if first or second:  # not blank lines and comments only
            out.append(Hunk((i1, i2), (j1, j2), first, second))
    return out


def differing_code(mechanical: Path, port: Path) -> list[str]:
    """`port.py:61: pass (the migration: dist.all_reduce(param.grad); ...)`, a line per hunk of
    the port that differs from the mechanical migration (blank lines and comments aside), the
    first SHOWN and a count of the rest; [] where a file cannot be read or none differs."""
    sources = Sources.read(mechanical, port)
    return named(sources, None) if sources is not None else []


def named(sources: Sources, divergence) -> list[str]:
    """The hunks, as the report names them: those that feed the divergence's quantity first (a
    static backward slice of each file from it: program_slice.py), at most SHOWN, the rest
    counted (the nearest to the quantity first); without a divergence (None), in the file's
    order. Where none feeds it, a first line says so, and the first hunks follow."""
    found = hunks(sources.before, sources.after)
    if not found:
        return []
    if divergence is None:
        return _shown([_name(h, sources) for h in found])
    feeding = _feeding(sources, found, divergence)
    if feeding is None:  # no seed in the files (a quantity the slice cannot place): the file's order
        return _shown([_name(h, sources) for h in found])
    what = _quantity(divergence)
    if not feeding:
        return [f"none of the {len(found)} hunk(s) feeds the {what} (a static slice of the program from it); "
                "the first:"] + _shown([_name(h, sources) for h in found])
    lines = [_name(h, sources) for h in feeding[:SHOWN]]
    rest = len(found) - len(lines)
    if rest:
        lines.append(f"and {rest} more hunk(s)" + (f", {len(found) - len(feeding)} of them not feeding the {what}"
                                                   if len(found) > len(feeding) else ""))
    return lines


def _feeding(sources: Sources, found: list[Hunk], divergence) -> list[Hunk] | None:
    """The hunks that touch either file's slice from the divergence's quantity, the nearest to it
    first (then in the file's order); None where neither file has a statement to slice from (or
    parses)."""
    nearest: dict[int, int] = {}
    sliced = False
    for text, which in ((sources.before, "first"), (sources.after, "second")):
        program = Program.parse(text)
        if program is None:
            continue
        if divergence.unit == "printed line":
            seeds = program.print_seeds(divergence.where or "")
        else:
            seeds = program.step_seeds()
        if not seeds:
            continue
        sliced = True
        lines = program.lines(program.backward_slice(seeds))
        for index, hunk in enumerate(found):
            start, end = getattr(hunk, which)
            depths = [lines[line] for line in range(start + 1, end + 1) if line in lines]
            if depths:
                nearest[index] = min(depths + [nearest.get(index, min(depths))])
    if not sliced:
        return None
    return [found[index] for index in sorted(nearest, key=lambda index: (nearest[index], index))]


def _quantity(divergence) -> str:
    if divergence.unit == "printed line":
        return f"printed line {divergence.step}"
    if divergence.step is None:
        return divergence.quantity
    return f"{divergence.quantity} at {divergence.unit} {divergence.step}"


def _name(hunk: Hunk, sources: Sources) -> str:
    """A hunk named by the lines of the file the user wrote: the port's (against the migration);
    the original's, with what the migration made of them (converted)."""
    if sources.converted:
        (i1, i2), before, after = hunk.first, hunk.before, hunk.after
        if before:
            where = f"{sources.before_name}:{i1 + 1}" + (f"-{i2}" if i2 - i1 > 1 else "")
            return f"{where}: {before}" + (f" (migrated: {after})" if after else " (the migration drops it)")
        return f"{sources.before_name}:{i1}: after it, the migration adds {after}"
    (j1, j2), before, after = hunk.second, hunk.before, hunk.after
    if after:
        where = f"{sources.after_name}:{j1 + 1}" + (f"-{j2}" if j2 - j1 > 1 else "")
        return f"{where}: {after}" + (f" (the migration: {before})" if before else " (not in the migration)")
    return f"{sources.after_name}:{j1}: after it, the migration's {before} is missing"


def _shown(lines: list[str]) -> list[str]:
    if len(lines) > SHOWN:
        lines[SHOWN:] = [f"and {len(lines) - SHOWN} more hunk(s)"]
    return lines


def _code(line: str) -> str:
    """A line as compared: its code, without indentation changes, trailing space or a comment line."""
    text = line.strip()
    return "" if text.startswith("#") else text


def _joined(lines: list[str]) -> str:
    text = "; ".join(code for code in map(_code, lines) if code)
    return text if len(text) <= LONGEST else text[:LONGEST - 3] + "..."
