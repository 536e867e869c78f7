"""A torch_xla file of any size made of real code: the top-level functions and classes of
fixtures/corpus/ (files from public repositories) that use torch_xla, each renamed on every
repetition, under the union of the files' imports. For bench_file_size.py's real-code growth
check and its guard in tests/test_engine.py: a per-file analysis linear in the file's size on
one training function repeated (dense_file) may still not be on the mix real files have.

    python benchmarks/real_code.py 1 > real_1mib.py     # MiB
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"
XLA_NAMES = ("torch_xla", "xm.", "xr.", "xs.", "pl.", "xmp.", "met.")


def _parts() -> tuple[list[str], list[tuple[str, str]]]:
    """(the corpus' import lines, each once; (name, source) of each top-level function or class
    that uses torch_xla), in file order."""
    imports, definitions = {}, []
    for path in sorted(CORPUS.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        for node in tree.body:
            segment = ast.get_source_segment(text, node, padded=True)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset == 0:
                imports.setdefault(segment, None)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                    and any(name in segment for name in XLA_NAMES):
                start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                source = "".join(text.splitlines(keepends=True)[start - 1:node.end_lineno])
                definitions.append((node.name, source))
    return list(imports), definitions


def real_code(size: int | None = None, rounds: int | None = None, every: int = 1) -> str:
    """Real torch_xla code: whole definitions, renamed on each repetition, until the text holds
    `size` bytes, or `rounds` times each definition (`every`: only every n-th one, for a smaller
    round of the same kinds of code). The same text for the same arguments."""
    imports, definitions = _parts()
    definitions = definitions[::every]
    parts = ["".join(line + "\n" for line in imports)]
    length, n = len(parts[0]), 0
    while length < size if size is not None else n < rounds * len(definitions):
        name, source = definitions[n % len(definitions)]
        # Renamed where it is defined (`def name(` / `class name(`/`:`), so each repetition is new.
        part = "\n\n" + source.replace(f" {name}(", f" {name}_{n}(", 1).replace(f"class {name}:", f"class {name}_{n}:", 1)
        parts.append(part)
        length += len(part)
        n += 1
    return "".join(parts)


if __name__ == "__main__":
    sys.stdout.write(real_code(int(float(sys.argv[1]) * (1 << 20))))
