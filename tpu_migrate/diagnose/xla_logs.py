"""Read torch_xla's debug files: the compile analysis of PT_XLA_DEBUG_FILE, the CPU fallbacks of
XLA_FNTRACKER_FILE and the graphs of XLA_SAVE_TENSORS_FILE. Each reader returns what the files say,
tied to the user's line; analysis.py decides what of it is a finding."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from tpu_migrate.diagnose.recording import EXPECTED_ATEN, is_library

FRAME = re.compile(r"^\s+(?P<fn>.+?) \((?P<file>.+):(?P<line>\d+)\)$")


@dataclass
class Compile:
    offset: int
    cause: str
    graph_hash: str | None
    file: str | None
    line: int | None
    step: int = 0
    origin: str | None = None  # the frames up to the user's (where in torch_xla's own code)


def parse_compiles(log: bytes, base: int = 0) -> list[Compile]:
    """The "Compilation Analysis" blocks of PT_XLA_DEBUG_FILE, with their byte offsets in the
    file (`log` starts at `base` there)."""
    compiles = []
    marker = b"Compilation Analysis: Compilation Cause"
    start = log.find(marker)
    while start != -1:
        end = log.find(marker, start + 1)
        block = log[start : end if end != -1 else len(log)].decode("utf-8", "replace")
        lines = [l.split("Compilation Analysis:", 1)[1] for l in block.splitlines()
                 if l.startswith("Compilation Analysis:")]
        cause = lines[1].strip() if len(lines) > 1 else ""
        graph_hash = next((l.split(":", 1)[1].strip() for l in lines if "Graph Hash:" in l), None)
        file = line = origin = None
        if "Python Frame Triggered Execution:" in block:
            frames_at = next(i for i, l in enumerate(lines) if "Python Frame Triggered Execution" in l)
            for text in lines[frames_at + 1 :]:
                match = FRAME.match(text)
                if match:  # the library frames up to the user's: which call in a library
                    origin = f"{origin or ''}|{text.strip()}"
                if match and not is_library(match["file"]):
                    file, line = os.path.abspath(match["file"]), int(match["line"])
                    break
        compiles.append(Compile(base + start, cause, graph_hash, file, line, origin=origin))
        start = end
    return compiles


FALLBACK_OP = re.compile(rb"at::_ops::(\w+?)(?:_out)?::")


def parse_fallbacks(log: bytes, base: int = 0) -> list[tuple[int, str, str, int]]:
    """(offset in the file, aten op, file, line) per CPU-fallback call in an XLA_FNTRACKER_FILE
    (--explain; `log` starts at `base` there).
    The record's tag is always `xla_fallback`; the op is in its C++ frames."""
    calls = []
    marker = b"[TAG xla_fallback"
    start = log.find(marker)
    while start != -1:
        end = log.find(marker, start + 1)
        block = log[start : end if end != -1 else len(log)]
        op_match = FALLBACK_OP.search(block)
        op = f"aten::{op_match[1].decode()}" if op_match else "aten::?"
        for text in block.decode("utf-8", "replace").splitlines():
            match = FRAME.match(text)
            if match and not is_library(match["file"]):
                if op not in EXPECTED_ATEN:
                    calls.append((base + start, op, os.path.abspath(match["file"]), int(match["line"])))
                break
        start = end
    return calls


def parse_graphs(text: str) -> dict[str, str]:
    """Graph hash -> IR text, from an XLA_SAVE_TENSORS_FILE."""
    graphs = {}
    for chunk in text.split("## BEGIN_GRAPH")[1:]:
        body, _, rest = chunk.partition("## END_GRAPH")
        match = re.search(r"Graph Hash: (\w+)", body)
        if match:
            graphs.setdefault(match[1], body)
    return graphs
