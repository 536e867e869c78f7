"""Rewrite a rule table's basic strings ("..." and \"\"\"...\"\"\") as literal strings ('...' and
'''...''') wherever that reads back as the same value: tomllib scans a basic string a character
at a time in Python and a literal one with str.find, and the rule tables are read at every start
(about half of their parse time went; test_config_and_catalog.py keeps them so).

    python tests/toml_literals.py rules/*.toml
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def convert(text: str) -> str:
    """`text` with every basic string that a literal string can hold (no backslash, no quote that
    would end it) written as one; comments and literal strings are copied as they are."""
    out, i, n = [], 0, len(text)
    while i < n:
        char = text[i]
        if char == "#":  # a comment runs to the end of its line (no key of the tables holds a '#')
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("'''", i):
            end = text.index("'''", i + 3) + 3
            while end < n and text[end] == "'":  # up to two quotes may close the body
                end += 1
        elif char == "'":
            end = text.index("'", i + 1) + 1
        elif text.startswith('"""', i):
            end = i + 3
            while not (text.startswith('"""', end) and text[end - 1] != "\\"):
                end += 1
            end += 3
            while end < n and text[end] == '"':
                end += 1
            body = text[i + 3:end - 3]
            if "\\" not in body and "'''" not in body and not body.endswith("'"):
                out.append(f"'''{body}'''")
                i = end
                continue
        elif char == '"':
            end = i + 1
            while text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            end += 1
            body = text[i + 1:end - 1]
            if "\\" not in body and "'" not in body:
                out.append(f"'{body}'")
                i = end
                continue
        else:
            end = i + 1
        out.append(text[i:end])
        i = end
    return "".join(out)


def main(paths: list[str]) -> None:
    for path in map(Path, paths):
        text = path.read_text(encoding="utf-8")
        converted = convert(text)
        if tomllib.loads(converted) != tomllib.loads(text):
            raise SystemExit(f"{path}: the literal strings would read differently; left as it is")
        path.write_text(converted, encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
