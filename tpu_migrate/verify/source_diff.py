"""The code a user's port changed beyond the migration tpu-migrate makes: with `verify --against`,
where the runs differ, the report names the port's lines that differ from the rewrite of the
original (what the rewrite produces mechanically is left out), not only the line that stepped
the optimizer."""

from __future__ import annotations

import difflib
from pathlib import Path

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


def differing_code(mechanical: Path, port: Path) -> list[str]:
    """`port.py:61: pass (the migration: dist.all_reduce(param.grad); ...)`, a line per hunk of
    the port that differs from the mechanical migration (blank lines and comments aside), the
    first SHOWN and a count of the rest; [] where a file cannot be read or none differs."""
    try:
        ours = mechanical.read_text(encoding="utf-8").splitlines()
        theirs = port.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    hunks = []
    matcher = difflib.SequenceMatcher(None, [_code(line) for line in ours], [_code(line) for line in theirs],
                                      autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        before, after = _joined(ours[i1:i2]), _joined(theirs[j1:j2])
        if not before and not after:  # blank lines and comments only
            continue
        if after:
            where = f"{port.name}:{j1 + 1}" + (f"-{j2}" if j2 - j1 > 1 else "")
            hunks.append(f"{where}: {after}" + (f" (the migration: {before})" if before else " (not in the migration)"))
        else:
            hunks.append(f"{port.name}:{j1}: after it, the migration's {before} is missing")
    if len(hunks) > SHOWN:
        hunks[SHOWN:] = [f"and {len(hunks) - SHOWN} more hunk(s)"]
    return hunks


def _code(line: str) -> str:
    """A line as compared: its code, without indentation changes, trailing space or a comment line."""
    text = line.strip()
    return "" if text.startswith("#") else text


def _joined(lines: list[str]) -> str:
    text = "; ".join(code for code in map(_code, lines) if code)
    return text if len(text) <= LONGEST else text[:LONGEST - 3] + "..."
