"""Open manual work: `# TODO(tpu-migrate): TPUxxx message` comments still in a file.

The rewriter marks what it cannot convert with such a comment and a finding. Once the file is
written, the torch_xla reference may be gone (a launch guard, a rebuilt statement), so the
comment is the only trace of the work: it stays a finding until a person removes it.

A file rewritten now (or whose TODO the rewriter would add again) yields a fresh finding for the
same comment; `unaccounted` keeps only the comments no fresh finding stands for, so nothing is
counted twice.
"""

from __future__ import annotations

import re
import tokenize
from collections import Counter

from tpu_migrate.findings import Manual

TEXT_MARKER = "TODO(tpu-migrate)"
_TODO = re.compile(r"#\s*TODO\(tpu-migrate\):\s*(TPU\d+)\b\s*(.*?)\s*$")
LINE_BREAK = re.compile(r"\r\n|\r|\n")  # Python's line breaks (as ast numbers lines)


def line_starts(text: str) -> list[int]:
    """The offset in `text` where each line starts, as ast numbers lines (line n at [n - 1])."""
    return [0] + [m.end() for m in LINE_BREAK.finditer(text)]


def open_todos(text: str) -> list[Manual]:
    """The TODO(tpu-migrate) comments of `text` (code, line, column of the `#`, message)."""
    if TEXT_MARKER not in text:
        return []
    found = []
    for line, col, comment in _comments(text):
        match = _TODO.match(comment)
        if match:
            found.append(Manual(match[1], line, col + 1, match[2]))
    return found


def _comments(text: str) -> list[tuple[int, int, str]]:
    """(line, 0-based column, text) of each comment. Tokens, so that a TODO quoted in a string
    is not one; a file the tokenizer refuses falls back to lines that are only a comment."""
    lines = LINE_BREAK.split(text)
    feed = iter(line + "\n" for line in lines)
    try:
        return [(tok.start[0], tok.start[1], tok.string)
                for tok in tokenize.generate_tokens(lambda: next(feed, ""))
                if tok.type == tokenize.COMMENT and TEXT_MARKER in tok.string]
    except (tokenize.TokenError, SyntaxError):
        return [(number, len(line) - len(line.lstrip()), line.lstrip())
                for number, line in enumerate(lines, start=1)
                if line.lstrip().startswith("#") and TEXT_MARKER in line]


def _key(finding: Manual) -> tuple[str, str]:
    return finding.code, " ".join(finding.message.split())


def unaccounted(fresh: list[Manual], todos: list[Manual]) -> list[Manual]:
    """The TODOs that no fresh finding stands for (one comment per finding with its code and
    message; the rewriter writes exactly `code message`)."""
    pending = Counter(_key(finding) for finding in fresh)
    extra = []
    for todo in todos:
        key = _key(todo)
        if pending[key]:
            pending[key] -= 1
        else:
            extra.append(todo)
    return extra


__all__ = ["open_todos", "unaccounted", "TEXT_MARKER"]

