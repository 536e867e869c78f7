"""torch_xla's debug output that diagnose reads, next to the user's own settings of it.

The tool switches on torch_xla's compile analysis (PT_XLA_DEBUG_LEVEL=1, written to a file of
its own) and, with --explain, the IR of every synced graph (XLA_IR_DEBUG, XLA_SAVE_TENSORS_FILE)
and the CPU-fallback tracker (XLA_FNTRACKER_FILE). A variable the user set is theirs and is never
overwritten: where it names a file, torch_xla appends to it as the user asked and the tool reads
what this run added; where it turns the output off, or sends it to stderr, the report says what
could not be measured because the user's setting won.
"""

from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass, field

# The most diagnose reads of what a run added to one debug file (the user's names any file:
# /dev/zero never ends). A long run's compile analysis is a few KB per compile.
READ_LIMIT = 256 * 1024 * 1024


@dataclass
class Log:
    """A file torch_xla appends to; what the run added starts at `base` (the size before)."""

    path: str
    base: int = 0

    @classmethod
    def at(cls, path: str) -> Log:
        try:
            info = os.stat(path)  # never opened here: a FIFO's open would wait for a writer
        except OSError:
            return cls(path, 0)
        return cls(path, info.st_size if stat.S_ISREG(info.st_mode) else 0)

    def read(self, notes: list[str] | None = None, limit: int | None = None) -> bytes:
        """What the run added, at most `limit` bytes (READ_LIMIT), from a regular file only, never
        waiting: a FIFO, a device (/dev/zero, /dev/urandom), a socket or a directory is not read,
        and `notes` gets a line saying so, as it does when the read was cut at the limit."""
        limit = READ_LIMIT if limit is None else limit
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        except OSError:
            return b""  # no such file: nothing was written
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                if notes is not None:
                    notes.append(f"{self.path} is not a regular file (a device, FIFO or socket): "
                                 "diagnose did not read it, and what torch_xla wrote there is not in the report")
                return b""
            wanted = max(0, info.st_size - self.base)  # what the run added, as the file stands now
            chunks, size = [], 0
            while size < min(wanted, limit):
                chunk = os.pread(fd, min(limit - size, 1 << 20), self.base + size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if wanted > limit and notes is not None:
                notes.append(f"{self.path}: the run added {wanted} bytes; diagnose read the first "
                             f"{limit} only, and the report stops there")
            return b"".join(chunks)
        except OSError:
            return b""
        finally:
            os.close(fd)


@dataclass
class DebugOutputs:
    env: dict[str, str] = field(default_factory=dict)  # what the program's environment gets
    compiles: Log | None = None  # PT_XLA_DEBUG_FILE
    fallbacks: Log | None = None  # XLA_FNTRACKER_FILE (--explain)
    graphs: list[Log] | None = None  # XLA_SAVE_TENSORS_FILE and its .<ordinal> files (--explain)
    graphs_prefix: str | None = None
    notes: list[str] = field(default_factory=list)

    def read_graphs(self) -> str:
        """The IR text the run added, in every file torch_xla wrote (it appends .<ordinal>)."""
        if self.graphs_prefix is None:
            return ""
        before = {log.path: log for log in self.graphs or []}
        text, left = "", READ_LIMIT  # the bound holds for all of them together
        for path in sorted(glob.glob(glob.escape(self.graphs_prefix) + "*")):
            if left <= 0:
                self.notes.append(f"{path}: not read, diagnose read {READ_LIMIT} bytes of graphs already")
                continue
            data = before.get(path, Log(path, 0)).read(self.notes, left)
            left -= len(data)
            text += data.decode("utf-8", "replace")
        return text


def _off(value: str) -> bool:
    return value.strip().lower() in ("", "0", "false", "no", "off")


def plan(environ: dict[str, str], workdir: str, explain: bool, torch_xla: bool = True) -> DebugOutputs:
    """`torch_xla`: whether the program may run torch_xla (backends xla and auto); a native or
    stand-in program gets none of its variables."""
    outputs = DebugOutputs()
    if not torch_xla:
        return outputs
    _plan_compiles(environ, workdir, outputs)
    if explain:
        _plan_explain(environ, workdir, outputs)
    return outputs


def _plan_compiles(environ, workdir, outputs: DebugOutputs) -> None:
    level, path = environ.get("PT_XLA_DEBUG_LEVEL"), environ.get("PT_XLA_DEBUG_FILE")
    if level is None:
        outputs.env["PT_XLA_DEBUG_LEVEL"] = "1"
    elif not (level.strip().isdigit() and int(level) >= 1):
        outputs.notes.append(f"your PT_XLA_DEBUG_LEVEL={level} turns torch_xla's compile analysis off: "
                             "recompiles are counted per step, without the line that triggered each "
                             "(unset it, or set it to 1 or more)")
        return
    if path:
        outputs.compiles = Log.at(path)  # the user's file: torch_xla appends to it
    elif level is not None:
        outputs.notes.append("your PT_XLA_DEBUG_LEVEL sends torch_xla's compile analysis to stderr, as you "
                             "asked: recompiles are counted per step, without the line that triggered each "
                             "(set PT_XLA_DEBUG_FILE too, and diagnose reads it there)")
    else:
        own = os.path.join(workdir, "xla_debug.txt")
        outputs.env["PT_XLA_DEBUG_FILE"] = own
        outputs.compiles = Log(own)


def _plan_explain(environ, workdir, outputs: DebugOutputs) -> None:
    ir_debug = environ.get("XLA_IR_DEBUG")
    if ir_debug is None:
        outputs.env["XLA_IR_DEBUG"] = "1"
    elif _off(ir_debug):
        outputs.notes.append(f"--explain: your XLA_IR_DEBUG={ir_debug} keeps the Python line of each "
                             "graph node out of the IR: what changed is said without where")
    fmt = environ.get("XLA_SAVE_TENSORS_FMT")
    if fmt is not None and fmt != "text":
        outputs.notes.append(f"--explain: your XLA_SAVE_TENSORS_FMT={fmt} writes graphs diagnose does not "
                             "read (it reads text): what changed between compiles is not said")
    else:
        if fmt is None:
            outputs.env["XLA_SAVE_TENSORS_FMT"] = "text"
        path = environ.get("XLA_SAVE_TENSORS_FILE")
        if path:
            outputs.graphs = [Log.at(p) for p in glob.glob(glob.escape(path) + "*")]
        else:
            path = os.path.join(workdir, "graphs.txt")
            outputs.env["XLA_SAVE_TENSORS_FILE"] = path
        outputs.graphs_prefix = path
    path = environ.get("XLA_FNTRACKER_FILE")
    if path:
        outputs.fallbacks = Log.at(path)
    else:
        path = os.path.join(workdir, "fallbacks.txt")
        outputs.env["XLA_FNTRACKER_FILE"] = path
        outputs.fallbacks = Log(path)
    if "XLA_FNTRACKER_LEVEL" not in environ:
        outputs.env["XLA_FNTRACKER_LEVEL"] = "3"  # the records with their Python frames
