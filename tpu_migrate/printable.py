"""Text from a user's tree on a terminal or in a CI log, never raw.

A file name or a TODO comment can hold a line break followed by `::error file=...::` (a GitHub
workflow command in the log) or ESC / OSC sequences (which a terminal obeys: colours, a window
title, hyperlinks). Every line the tool prints with such text in it goes through `printable`,
which writes each control character as an escape (`\\n`, `\\x1b`); a command line to copy and run
quotes such a name with bash's `$'...'`; a diff header quotes it as git does, so `git apply`
still reads it.
"""

from __future__ import annotations

import re
import shlex

# C0 controls but the tab, DEL, C1 controls, Unicode's line and paragraph separators, and the
# lone surrogates that stand for a name's undecodable bytes.
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the byte it stands for
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control character written as an escape."""
    return _UNSAFE.sub(lambda match: _escape(match[0]), text)


def shell_quote(arg: str) -> str:
    """`arg` for a POSIX shell command line; `$'...'` (bash, zsh) when it has control characters."""
    if not _UNSAFE.search(arg):
        return shlex.quote(arg)
    body = arg.replace("\\", "\\\\").replace("'", "\\'")
    return "$'" + printable(body) + "'"


def git_quote(name: str) -> str:
    """A diff header's file name as git writes it: in double quotes with C escapes when it has a
    control character, a quote or a backslash (git apply reads that back); else as it is."""
    if not (_UNSAFE.search(name) or '"' in name or "\\" in name):
        return name
    out = []
    for char in name:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char == "\t":
            out.append("\\t")
        elif _UNSAFE.match(char):
            data = char.encode("utf-8", errors="surrogateescape")
            out.append("\\n" if char == "\n" else "".join(f"\\{byte:03o}" for byte in data))
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


__all__ = ["printable", "shell_quote", "git_quote"]
