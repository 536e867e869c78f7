"""How many lines the rewrite adds per torch_xla reference it converts, per file and in total,
for both targets: a measure of how lean the generated code is.

    python tools/added_lines.py                # fixtures/corpus and fixtures/realistic
    python tools/added_lines.py --programs     # also fixtures/programs (all depths)
    python tools/added_lines.py FILES...       # these files

Each file is rewritten on its own, in process (as tests/static_fidelity.py does), with default
options and `--target tpu`, then `--target portable`.

- **references**: loads of a name (`xm` in `xm.mark_step()`, `MpDeviceLoader(...)`, a name in a
  string annotation) that resolve, with Python's scoping (tests/fidelity.py's `_Scopes`), to a
  binding made by a `torch_xla` / `torch_xla_py` / `optimum.tpu` import in that scope.
- **converted**: references in the input minus references left in the output (a reference left
  marked with a TODO counts as not converted).
- **added**: non-blank output lines that the input does not have at that place: the lines of
  the `insert` and `replace` blocks of a line diff (difflib.SequenceMatcher, no autojunk) of the
  input against the output. Comments and TODO lines count; a line only re-indented counts too.
- **net**: output lines minus input lines (all lines, blank ones included).
- **per ref**: added / converted (`-` where nothing was converted).

Files the rewrite leaves unchanged are listed with zeros. The totals row sums the columns and
divides the sums.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from fidelity import _loads, _migrated, _Scopes, bound_name  # noqa: E402

TARGETS = ("tpu", "portable")


def references(text: str) -> int:
    """Loads of names bound by a torch_xla / optimum.tpu import (see the module's docstring)."""
    tree = ast.parse(text)
    scopes = _Scopes(tree)
    imported: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases = [a for a in node.names if _migrated(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _migrated(node.module):
            aliases = [a for a in node.names if a.name != "*"]
        else:
            continue
        for alias in aliases:
            name = bound_name(alias, node)
            imported.add((id(scopes._binding_scope(scopes.scope_of(node), name)), name))
    count = 0
    for name, node in _loads(tree):
        target = scopes.resolve(name, scopes.scope_of(node))
        if target is not None and (id(target), name) in imported:
            count += 1
    return count


def added_lines(before: str, after: str) -> int:
    """Non-blank lines of `after` in the insert and replace blocks of a line diff."""
    old, new = before.splitlines(), after.splitlines()
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    added = 0
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag in ("insert", "replace"):
            added += sum(1 for line in new[j1:j2] if line.strip())
    return added


def measure(path: Path, target: str) -> tuple[int, int, int]:
    """(converted, added, net) of one file's rewrite."""
    from static_fidelity import rewrite

    data = path.read_bytes()
    output, _ = rewrite(data, path.name, target)
    before, after = data.decode("utf-8"), output.decode("utf-8")
    converted = references(before) - references(after)
    return converted, added_lines(before, after), len(after.splitlines()) - len(before.splitlines())


def _ratio(added: int, converted: int) -> str:
    return f"{added / converted:.2f}" if converted > 0 else "-"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tools/added_lines.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", action="store_true", help="also fixtures/programs")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    fixtures = ROOT / "fixtures"
    files = args.files or sorted(fixtures.glob("corpus/*.py")) + sorted(fixtures.glob("realistic/*.py"))
    if args.programs and not args.files:
        files += sorted(fixtures.glob("programs/**/*.py"))
    width = max([len(p.name) for p in files] + [5])
    columns = "".join(f"  {t + ' conv':>13}{'added':>7}{'net':>6}{'per ref':>8}" for t in TARGETS)
    print(f"{'file':<{width}}{columns}")
    totals = {t: [0, 0, 0] for t in TARGETS}
    for path in files:
        row = f"{path.name:<{width}}"
        for target in TARGETS:
            converted, added, net = measure(path, target)
            for i, value in enumerate((converted, added, net)):
                totals[target][i] += value
            row += f"  {converted:>13}{added:>7}{net:>6}{_ratio(added, converted):>8}"
        print(row)
    row = f"{'total':<{width}}"
    for target in TARGETS:
        converted, added, net = totals[target]
        row += f"  {converted:>13}{added:>7}{net:>6}{_ratio(added, converted):>8}"
    print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
