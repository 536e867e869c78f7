"""The result model shared by every command: what was fixed, what needs a person, what failed."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fix:
    """A rule applied automatically. `line`/`col` are 1-based and refer to the input file."""

    code: str
    line: int
    col: int = 1
    cell: int | None = None  # notebooks: the code cell; `line` is then within the cell


@dataclass(frozen=True)
class Manual:
    """Work the tool cannot do; the code is left as it is with a TODO comment above it."""

    code: str
    line: int
    col: int
    message: str
    # The source text of the reference (`met.metrics_report`): where the TODO goes when a
    # rule rebuilt the statement around it. Not part of the finding's identity or output.
    anchor: str | None = field(default=None, compare=False, repr=False)
    cell: int | None = None  # notebooks: the code cell; `line` is then within the cell
    # False for work deferred, not impossible (an unsafe fix at --fix-level safe): reported,
    # with no TODO comment, which would go stale once a later run applies it.
    todo: bool = field(default=True, compare=False, repr=False)


@dataclass(frozen=True)
class Note:
    """A warning about the input that is not a finding (an ignore comment naming no rule)."""

    line: int
    message: str
    cell: int | None = None  # notebooks: the code cell; `line` is then within the cell


@dataclass(frozen=True)
class KeptImport:
    """A torch_xla / optimum.tpu import the rewritten file still has (an `import` statement, or
    `importlib.import_module("torch_xla...")`): the file cannot run without torch_xla."""

    line: int
    module: str
    cell: int | None = None  # notebooks: the code cell; `line` is then within the cell


@dataclass
class FileResult:
    path: str
    changed: bool = False
    error: str | None = None
    # The line the error is at, when it has one (a syntax error): SARIF and GitHub point there.
    error_line: int | None = None
    error_cell: int | None = None  # notebooks: the code cell of `error_line`
    fixes: list[Fix] = field(default_factory=list)
    manual: list[Manual] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    # The input imports torch_xla / optimum.tpu (the migration report's "files with torch_xla").
    imports_xla: bool = False
    kept_imports: list[KeptImport] = field(default_factory=list)
    # Set when `changed`; never serialised (the CLI writes or diffs it).
    original: bytes | None = None
    output: bytes | None = None
    # The inode of the file `original` was read from: a write goes to that file or nowhere.
    inode: int | None = field(default=None, compare=False)
    # Notebooks: cell index -> (old source, new source) of the cells that changed.
    cell_diffs: dict[int, tuple[str, str]] | None = None
    # The input lines of the TODO(tpu-migrate) comments the rewrite dropped, their work done
    # (an earlier run's note on code this run converts): not open work. Never serialised.
    done_todos: frozenset[int] = field(default=frozenset(), compare=False, repr=False)

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "changed": self.changed,
            "error": self.error,
            "fixes": [with_cell({"code": f.code, "line": f.line, "col": f.col}, f.cell)
                      for f in self.fixes],
            "manual": [
                with_cell({"code": m.code, "line": m.line, "col": m.col, "message": m.message}, m.cell)
                for m in self.manual
            ],
        }


def with_cell(entry: dict, cell: int | None) -> dict:
    if cell is not None:
        entry["cell"] = cell
    return entry
