"""Open manual work: `# TODO(tpu-migrate): TPUxxx message` comments still in a file.

The rewriter marks what it cannot convert with such a comment and a finding. Once the file is
written, the torch_xla reference may be gone (a launch guard, a rebuilt statement), so the
comment is the only trace of the work: it stays a finding until a person removes it.

A file rewritten now (or whose TODO the rewriter would add again) yields a fresh finding for the
same comment; `unaccounted` keeps only the comments no fresh finding stands for, so nothing is
counted twice.
"""

from __future__ import annotations

import ast
import re
import tokenize
from collections import Counter
from itertools import accumulate

from tpu_migrate.findings import Manual

TEXT_MARKER = "TODO(tpu-migrate)"
_TODO = re.compile(r"#\s*TODO\(tpu-migrate\):\s*(TPU\d+)\b\s*(.*?)\s*$")
LINE_BREAK = re.compile(r"\r\n|\r|\n")  # Python's line breaks (as ast numbers lines)


def todo_comment(comment: str) -> re.Match | None:
    """`# TODO(tpu-migrate): CODE message` parsed (the code is group 1, the message group 2)."""
    return _TODO.match(comment)


def line_starts(text: str) -> list[int]:
    """The offset in `text` where each line starts, as ast numbers lines (line n at [n - 1])."""
    if "\r" in text:
        return [0] + [m.end() for m in LINE_BREAK.finditer(text)]
    return newline_starts(text)


def newline_starts(text: str) -> list[int]:
    """The offset in `text` after each "\n", after 0 (line n at [n - 1] where "\n" ends lines):
    from the lines' lengths, about a third of the time of a regular expression's matches."""
    starts = list(accumulate([len(line) + 1 for line in text.split("\n")], initial=0))
    starts.pop()  # the end of the last line, which no "\n" ends
    return starts


def open_todos(text: str) -> list[Manual]:
    """The TODO(tpu-migrate) comments of `text` (code, line, column of the `#`, message)."""
    if TEXT_MARKER not in text:
        return []
    found = []
    for line, col, comment in _comments(text):
        match = todo_comment(comment)
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


def unaccounted(fresh: list[Manual], todos: list[Manual], text: str = "") -> list[Manual]:
    """The TODOs that no fresh finding stands for: one comment per finding with its code and
    message (the rewriter writes exactly `code message`), or else with its code, above the
    statement the finding is in (the rewriter adds no second TODO of a rule there, whatever
    the wording: layout.py). `text` is the file's, for the statements' lines."""
    pending = Counter(_key(finding) for finding in fresh)
    extra = []
    for todo in todos:
        key = _key(todo)
        if pending[key]:
            pending[key] -= 1
        else:
            extra.append(todo)
    if not extra:
        return extra
    worded_otherwise = []  # the fresh findings that no comment says word for word
    for finding in fresh:
        key = _key(finding)
        if pending[key]:
            pending[key] -= 1
            worded_otherwise.append(finding)
    spans = _statement_lines(text) if worded_otherwise else {}
    kept = []
    for todo in extra:
        start = _below_comments(text, todo.line)
        end = spans.get(start, start)
        match = next((f for f in worded_otherwise if f.code == todo.code and start <= f.line <= end), None)
        if match is None:
            kept.append(todo)
        else:
            worded_otherwise.remove(match)
    return kept


def _below_comments(text: str, line: int) -> int:
    """The first line after `line` that is neither blank nor only a comment: the start of the
    statement a TODO comment at `line` sits above."""
    lines = LINE_BREAK.split(text)
    index = line  # the next line's 0-based index
    while index < len(lines) and (not lines[index].strip() or lines[index].lstrip().startswith("#")):
        index += 1
    return index + 1


def _statement_lines(text: str) -> dict[int, int]:
    """First line -> last line of the statements starting there (a compound statement: its
    header); {} where the text does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return {}
    spans: dict[int, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            body = getattr(node, "body", None)
            end = body[0].lineno - 1 if isinstance(body, list) and body else node.end_lineno
            spans[node.lineno] = max(spans.get(node.lineno, node.lineno), end, node.lineno)
    return spans


__all__ = ["open_todos", "todo_comment", "unaccounted", "TEXT_MARKER"]

