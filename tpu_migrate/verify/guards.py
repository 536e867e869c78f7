"""Whether a line a process prints is printed by one process of the world, not by every one:
said of the original's lines, which ran at one process, where it cannot be seen who else would
have printed them (recorder.py notes it per printed line; printed.py uses it).

A line is printed once when a frame that prints it passes through torch_xla's `master_print`, or
stands under an `if` (either branch) whose test asks which process this is (`xm.is_master_ordinal()`,
`xr.global_ordinal() == 0`, `rank == 0`, `index == 0`, ...). Anything else every process prints.
Read from the source, by the frames that print: a line printed under a test the source does not
show (a flag computed from the rank far away) counts as every process's.
"""

from __future__ import annotations

import ast
import re

# The words of a test that asks which process this is.
RANK_TEST = re.compile(r"(?i)master|ordinal|rank|is_main|main_process|process_index|\bindex\s*[=!]=\s*0\b")

_tests: dict[str, list[tuple[int, int]]] = {}   # file -> line ranges under a rank test
_answers: dict[tuple[str, int], bool] = {}


def printed_once(frame, is_library) -> bool:
    """Whether what the code at `frame` (and its callers) prints is printed by one process only;
    `is_library(filename)` says which frames are not the program's."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "master_print" and "torch_xla" in code.co_filename:
            return True
        if not is_library(code.co_filename) and _under_rank_test(code.co_filename, frame.f_lineno):
            return True
        frame = frame.f_back
    return False


def _under_rank_test(filename: str, line: int) -> bool:
    key = (filename, line)
    if key not in _answers:
        if filename not in _tests:
            _tests[filename] = _rank_tested_ranges(filename)
        _answers[key] = any(first <= line <= last for first, last in _tests[filename])
    return _answers[key]


def _rank_tested_ranges(filename: str) -> list[tuple[int, int]]:
    """The line ranges of the branches of every `if` that tests which process this is."""
    try:
        with open(filename, encoding="utf-8") as handle:
            source = handle.read()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []
    ranges = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and RANK_TEST.search(ast.get_source_segment(source, node.test) or ""):
            for branch in (node.body, node.orelse):
                if branch:
                    ranges.append((branch[0].lineno, branch[-1].end_lineno or branch[-1].lineno))
    return ranges
