"""Where comments and TODOs go when the walk removes, splits or rebuilds statements.

A removed statement leaves its comments above the next one (not its blank lines, unless the
next has none); a trailing comment about torch_xla's machinery goes with the statement it
described. A rule's manual findings become `# TODO(tpu-migrate): CODE message` lines above the
statement, or above the innermost new statement holding their reference, so that a second run
puts them in the same place (tests/test_fidelity.py checks the output is a fixed point);
rewrite/todos.py reads them back. A TODO of a rule the walk now converts in its statement (an
earlier run's, with another target) goes (`drop_done_todos`).
"""

from __future__ import annotations

import re
from collections import Counter

import libcst as cst

from tpu_migrate.rewrite.todos import TEXT_MARKER, todo_comment

TODO_PREFIX = f"# {TEXT_MARKER}: "


def comments_of_removed_if(stmt: cst.If) -> list[cst.EmptyLine]:
    """What stays of a removed `if`: the comments above it and in its body (as for a removed
    statement), not its blank lines."""
    lines = [line for line in stmt.leading_lines if line.comment is not None]
    lines.extend(header_comments(stmt.body.header))
    for inner in stmt.body.body:
        lines.extend(line for line in inner.leading_lines if line.comment is not None)
    lines.extend(line for line in stmt.body.footer if line.comment is not None)
    return lines


def header_comments(header: cst.TrailingWhitespace) -> list[cst.EmptyLine]:
    """The comment after a removed block's colon, as a line of its own (unless it described
    torch_xla's machinery)."""
    comment = header.comment
    if comment is None or _about_xla(comment.value):
        return []
    return [cst.EmptyLine(indent=True, comment=comment)]


# A trailing comment about torch_xla's machinery: it described the statement a rule removed.
_XLA_WORDS = re.compile(
    r"xla|\bxm\.|\bxmp\b|\bxr\.|mark_step|\bsync|all[-_ ]?reduce|rendezvous|pjrt|\bxrt\b|step marker|"
    r"\bgraph|\btpu",
    re.IGNORECASE,
)


def _about_xla(comment: str) -> bool:
    return bool(_XLA_WORDS.search(comment))


# What a comment right above a removed step marker says when it describes that statement: how
# torch_xla ran lazy graphs (not what the code around it is for, which a comment naming torch_xla
# or SPMD may well say).
_LAZY_WORDS = re.compile(r"mark_step|\bsync|\blazy\b|step marker|\bgraph|\bflush", re.IGNORECASE)


def _leading_of_removed(lines) -> list[cst.EmptyLine]:
    """The lines above a removed statement, less the comment right above it (no blank line
    between) where every line of it is about torch_xla's lazy execution (`# sync any pending
    lazy tensors`): it described the statement that went, as a trailing comment would."""
    lines = list(lines)
    start = len(lines)
    while start and lines[start - 1].comment is not None:
        start -= 1
    block = lines[start:]
    if block and all(_LAZY_WORDS.search(line.comment.value) and "TODO(tpu-migrate)" not in line.comment.value
                     for line in block):
        return lines[:start]
    return lines


def _comment_of(ws: cst.TrailingWhitespace, removed: bool = False) -> list[cst.EmptyLine]:
    """A trailing comment as a line of its own. `removed`: its statement is gone, and a comment
    about torch_xla (`# sync the graph`) would then describe the next statement: dropped."""
    if ws.comment is None or (removed and _about_xla(ws.comment.value)):
        return []
    return [cst.EmptyLine(indent=True, comment=ws.comment)]


def prepend_lines(stmt: cst.BaseStatement, lines: list[cst.EmptyLine]) -> cst.BaseStatement:
    return stmt.with_changes(leading_lines=merge_leading_lines(lines, stmt.leading_lines))


def merge_leading_lines(carried, existing) -> list[cst.EmptyLine]:
    """Comments of a removed statement go above the next one. Its blank lines only do when
    the next statement has none, so removing a line never adds vertical space."""
    if existing and existing[0].comment is None:
        carried = [line for line in carried if line.comment is not None]
    return [*carried, *existing]


def add_todos(stmt: cst.BaseStatement, todos, present: frozenset[str] = frozenset()) -> cst.BaseStatement:
    """Add TODO comments above `stmt`, except those already there (in its leading lines, or in
    `present`: the comments above it in the source, which libcst may have given to the module
    header instead)."""
    existing = {line.comment.value for line in stmt.leading_lines if line.comment is not None}
    new_lines = _todo_lines(todos, existing | present)
    if not new_lines:
        return stmt
    return stmt.with_changes(leading_lines=[*stmt.leading_lines, *new_lines])


def _todo_lines(todos, existing: set[str]) -> list[cst.EmptyLine]:
    """A comment line per TODO not already in `existing` (nor said twice). A TODO of the same
    rule there stands for it whatever its wording: a rule's message may depend on the target (a
    portable tree checked again with the tpu target) or on what the file holds after a first run,
    and the statement still needs one note of that rule, not two."""
    texts = [f"{TODO_PREFIX}{todo.code} {todo.message}" for todo in todos]
    # The rule codes of the TODOs already there that none of these says word for word.
    other_wording = Counter(match[1] for match in map(todo_comment, set(existing) - set(texts)) if match)
    existing = set(existing)
    lines = []
    for todo, text in zip(todos, texts):
        if text in existing:
            continue
        existing.add(text)
        if other_wording[todo.code]:
            other_wording[todo.code] -= 1
            continue
        lines.append(cst.EmptyLine(indent=True, comment=cst.Comment(text)))
    return lines


def drop_done_todos(stmt: cst.BaseStatement, first_line: int, source_lines: list[str], done: set[str],
                    superseded: frozenset[str] = frozenset()):
    """`stmt` without the `# TODO(tpu-migrate): CODE ...` comments directly above it (no blank
    line between) whose CODE is in `done`: rules this run converted in the statement and
    reported nothing more of, so the note an earlier run wrote there (the portable target's,
    on code the tpu target converts) says something no longer true. Returns it and the input
    lines of the comments dropped. Only comments in the tool's form go, and only where the
    input has them at that line (`first_line`: the statement's, decorators included; a comment
    libcst gave to the module's header stays, and so is still open work); a person's own
    comments stay. A comment in `superseded` (its whole text) goes too: a finding of this run
    rewords it (StatementContext.supersede) and writes its own."""
    leading = list(stmt.leading_lines)
    dropped = []
    line = first_line - 1  # the input line of leading[index]
    for index in range(len(leading) - 1, -1, -1):
        comment = leading[index].comment
        if comment is None:
            break
        match = todo_comment(comment.value)
        if match and (match[1] in done or _one_spacing(comment.value) in superseded) and 0 < line <= len(source_lines) \
                and source_lines[line - 1].strip() == comment.value.strip():
            dropped.append(line)
            del leading[index]
        line -= 1
    if not dropped:
        return stmt, []
    return stmt.with_changes(leading_lines=leading), dropped


def _one_spacing(text: str) -> str:
    return " ".join(text.split())


def rebuild_line(line: cst.SimpleStatementLine, pieces, todos, present=frozenset()):
    """Turn the rewritten small statements of one line back into statements.

    A piece is a small statement (kept on a line) or a list of whole statements (a removed
    statement is an empty list; `xm.save(...)` becomes an `if` block).
    """
    out: list[cst.BaseStatement] = []
    run: list[cst.BaseSmallStatement] = []

    def flush() -> None:
        if run:
            last = run[-1]
            if last is not line.body[-1]:
                last = last.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            out.append(cst.SimpleStatementLine(body=[*run[:-1], last]))
            run.clear()

    for piece in pieces:
        if isinstance(piece, list):
            flush()
            out.extend(piece)
        else:
            run.append(piece)
    flush()

    removed_comments: list[cst.EmptyLine] = []
    if not out:
        # The line's comments, and the TODOs of a statement that went (`xr.use_spmd()`), stay
        # where it was: above the next statement.
        removed_comments = [*_leading_of_removed(line.leading_lines),
                            *_comment_of(line.trailing_whitespace, removed=True),
                            *_todo_lines(todos, present)]
        return [], removed_comments
    if len(out) == 1 and isinstance(out[0], cst.SimpleStatementLine) and all(
        not isinstance(p, list) for p in pieces
    ):
        out[0] = line.with_changes(body=out[0].body)
    else:
        out[0] = prepend_lines(out[0], list(line.leading_lines))
        last = out[-1]
        if len(out) == 1 and isinstance(last, cst.SimpleStatementLine):
            out[-1] = last.with_changes(trailing_whitespace=line.trailing_whitespace)
        elif line.trailing_whitespace.comment is not None:
            # Several statements replace the line (`xm.optimizer_step(opt)  # all-reduce +
            # step`): its comment describes them all, so it goes above them, not on the last.
            out[0] = prepend_lines(out[0], _comment_of(line.trailing_whitespace))
    if todos:
        if any(isinstance(p, list) for p in pieces):
            out = _place_todos(out, todos, present)
        else:
            out[0] = add_todos(out[0], todos, present)
    return out, []


def _place_todos(statements, todos, present):
    """A rule rebuilt the statement (`xm.master_print(x)` -> `if ...: print(x)`): put each
    TODO above the innermost new statement that holds its reference, where a second run
    would put it, so the output is a fixed point."""
    statements = list(statements)
    for todo in todos:
        for i, stmt in enumerate(statements):
            placed = _attach(stmt, todo, present)
            if placed is not None:
                statements[i] = placed
                break
        else:
            statements[0] = add_todos(statements[0], [todo], present)
    return statements


def _attach(stmt, todo, present):
    """`stmt` with the TODO above its innermost statement containing the anchor, or None."""
    if todo.anchor is None or todo.anchor not in _CODEGEN.code_for_node(stmt):
        return None
    body = getattr(stmt, "body", None)
    if isinstance(body, cst.IndentedBlock):
        inner = list(body.body)
        for i, child in enumerate(inner):
            placed = _attach(child, todo, present)
            if placed is not None:
                inner[i] = placed
                return stmt.with_changes(body=body.with_changes(body=inner))
    return add_todos(stmt, [todo], present)


_CODEGEN = cst.Module(body=[])


__all__ = [
    "TODO_PREFIX", "add_todos", "comments_of_removed_if", "drop_done_todos", "merge_leading_lines",
    "prepend_lines", "rebuild_line",
]
