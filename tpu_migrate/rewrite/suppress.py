"""`# tpu-migrate: ignore` and `# tpu-migrate: ignore[TPU010,TPU020]` comments."""

from __future__ import annotations

import re

from tpu_migrate.rewrite.context import ALL_CODES

_PATTERN = re.compile(r"#\s*tpu-migrate:\s*ignore(?:\[([A-Z0-9,\s]*)\])?")


def parse_suppressions(text: str) -> dict[int, frozenset[str]]:
    """Line number -> suppressed codes ({ALL_CODES} for a bare ignore)."""
    if "tpu-migrate:" not in text:
        return {}
    result: dict[int, frozenset[str]] = {}
    for match in _PATTERN.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        codes = match.group(1)
        if codes is None:
            result[line] = frozenset({ALL_CODES})
        else:
            result[line] = frozenset(c.strip() for c in codes.split(",") if c.strip())
    return result


def unknown_codes(text: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, code) for each code an ignore comment names that is no rule: a typo there would
    otherwise silently suppress nothing."""
    return [(line, code) for line, codes in sorted(parse_suppressions(text).items())
            for code in sorted(codes) if code != ALL_CODES and code not in known]
