"""The parent half of `diagnose`: start the program under the tracer, wait, collect the evidence.

The program runs in a child interpreter (tpu_migrate.diagnose.bootstrap) with torch_xla's own
compile analysis switched on (PT_XLA_DEBUG_LEVEL=1, measured at no overhead, written to a file)
and a sitecustomize on PYTHONPATH, so worker processes started by xmp.spawn / torch_xla.launch /
torch.multiprocessing are traced too. Everything lives in a temporary directory that is removed
afterwards.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from tpu_migrate.diagnose.tracer import ENV_DEBUG_FILE, ENV_DIR

SITECUSTOMIZE = '''# Written by tpu-migrate diagnose: trace every Python process of the diagnosed program.
try:
    from tpu_migrate.diagnose import tracer as _tpu_migrate_tracer
    _tpu_migrate_tracer.install()
except Exception:  # never break the program being diagnosed
    pass
'''


@dataclass
class Evidence:
    exit_code: int
    events: dict[int, list[dict]] = field(default_factory=dict)  # pid -> events in order
    debug_log: bytes = b""  # torch_xla's PT_XLA_DEBUG_FILE (byte offsets matter)
    graphs: str = ""  # --explain: XLA_SAVE_TENSORS_FILE, every synced graph's IR
    fallback_log: bytes = b""  # --explain: XLA_FNTRACKER_FILE, one record per CPU-fallback call


def run(target: str, args: list[str], module: bool, stdout=None, explain: bool = False) -> Evidence:
    """Run the program to completion (Ctrl-C stops the program, not the report).

    `explain` also records the IR of every graph with the Python line of each node
    (XLA_IR_DEBUG + XLA_SAVE_TENSORS_FILE): what changed between two compiles of a line. It
    costs about 2-3x, so it is opt-in.
    """
    workdir = tempfile.mkdtemp(prefix="tpu-migrate-diagnose-")
    try:
        site = os.path.join(workdir, "site")
        os.mkdir(site)
        with open(os.path.join(site, "sitecustomize.py"), "w", encoding="utf-8") as handle:
            handle.write(SITECUSTOMIZE)
        debug_file = os.path.join(workdir, "xla_debug.txt")
        python_path = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)
        env = {
            **os.environ,
            ENV_DIR: workdir,
            ENV_DEBUG_FILE: debug_file,
            "PT_XLA_DEBUG_LEVEL": "1",
            "PYTHONPATH": python_path,
        }
        graphs_file = os.path.join(workdir, "graphs.txt")
        fallback_file = os.path.join(workdir, "fallbacks.txt")
        if explain:
            env.update({"XLA_IR_DEBUG": "1", "XLA_SAVE_TENSORS_FILE": graphs_file,
                        "XLA_SAVE_TENSORS_FMT": "text",
                        "XLA_FNTRACKER_FILE": fallback_file, "XLA_FNTRACKER_LEVEL": "3"})
        command = [sys.executable, "-m", "tpu_migrate.diagnose.bootstrap",
                   "module" if module else "script", target, *args]
        process = subprocess.Popen(command, env=env, stdout=stdout)
        # Ignore Ctrl-C here only now: an ignored SIGINT would be inherited by the program. The
        # terminal signals the whole process group; the program stops, and we still report.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            try:
                exit_code = process.wait()
            except KeyboardInterrupt:
                exit_code = process.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
        evidence = Evidence(exit_code=exit_code, events=read_events(workdir))
        for path in sorted(glob.glob(graphs_file + "*")):  # torch_xla appends .<ordinal>
            with open(path, encoding="utf-8", errors="replace") as handle:
                evidence.graphs += handle.read()
        if os.path.exists(debug_file):
            with open(debug_file, "rb") as handle:
                evidence.debug_log = handle.read()
        if os.path.exists(fallback_file):
            with open(fallback_file, "rb") as handle:
                evidence.fallback_log = handle.read()
        return evidence
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def read_events(directory: str) -> dict[int, list[dict]]:
    """The events every traced process wrote, by process id, in order."""
    events = {}
    for path in sorted(glob.glob(os.path.join(directory, "events.*.jsonl"))):
        pid = int(path.rsplit(".", 2)[1])
        with open(path, encoding="utf-8") as handle:
            events[pid] = [json.loads(line) for line in handle if line.strip()]
    return events
