"""Files a directory run does not rewrite but that still mention torch_xla: launch scripts that
export PJRT_DEVICE, job files, YAML / JSON / TOML configs with `device: xla`. The plan lists them
(path, line and the line itself), so a team sees the whole migration, not only its Python part;
porting them stays with a person.

Only small text files of the kinds that configure or launch a program are read (a data file or a
checkpoint is never opened): the suffixes and names below, up to MAX_SIZE bytes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

SUFFIXES = frozenset({".sh", ".bash", ".zsh", ".ksh", ".yaml", ".yml", ".json", ".toml", ".cfg", ".ini",
                      ".conf", ".env", ".txt", ".in", ".mk", ".sbatch", ".slurm", ".j2", ".jinja", ".tpl"})
NAMES = frozenset({"Makefile", "makefile", "GNUmakefile", "Procfile", "Jenkinsfile", ".env"})
MAX_SIZE = 1 << 20
# torch_xla itself, its environment variables, its launch and device idioms, a device named "xla".
MENTION = re.compile(
    rb"torch[_-]xla|PJRT_DEVICE|XRT_TPU_CONFIG|\bXLA_[A-Z][A-Z_]+|xla_device|xla_multiprocessing"
    rb"|\bdevice[\"']?\s*[:=]\s*[\"']?xla\b")


@dataclass(frozen=True)
class Mention:
    path: str
    line: int
    text: str  # the line, stripped and cut to 120 characters


def is_candidate(path: str) -> bool:
    name = os.path.basename(path)
    return name in NAMES or os.path.splitext(name)[1].lower() in SUFFIXES


def first_mention(path: str) -> Mention | None:
    """The first line of `path` that mentions torch_xla, if it is a candidate that does."""
    if not is_candidate(path):
        return None
    try:
        if os.path.getsize(path) > MAX_SIZE:
            return None
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    found = MENTION.search(data)
    if found is None or b"\0" in data[:8192]:
        return None
    start = data.rfind(b"\n", 0, found.start()) + 1
    end = data.find(b"\n", found.end())
    text = data[start:end if end != -1 else len(data)].decode("utf-8", "replace").strip()
    return Mention(path, data.count(b"\n", 0, found.start()) + 1, text[:120])
