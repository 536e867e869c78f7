"""Dependencies on torch_xla / optimum-tpu (TPU098): requirement strings, dependency files and
notebook install lines.

A migrated project must not keep installing torch_xla silently. Python code (a `setup.py`'s
`install_requires`, a `pip install` argument list) is covered by the rewriter, which marks the
strings with a TODO; the files that are not Python (`requirements*.txt`, `pyproject.toml`,
requirement directories, Dockerfiles) get a report line from `scan_dependency_file`, and
notebooks' `!pip install torch_xla` lines from notebooks.py. Nothing here rewrites anything:
which TorchTPU package and version to depend on is the project's decision.
"""

from __future__ import annotations

import fnmatch
import os
import re

from tpu_migrate.findings import Manual
from tpu_migrate.rewrite.registry import rule_code

CODE = rule_code("TPU098")

# A distribution name as pip reads it: `torch_xla`, `torch-xla`, `Torch.XLA`, `optimum-tpu`.
# (Not libtpu: what TorchTPU itself runs on may need it.)
_NAME = r"(?:torch[-_.]xla|optimum[-_.]tpu)"
# A requirement that can only be a distribution: the dash spelling, or extras / a version /
# a URL / a marker after the name (`torch_xla` alone is also the module's name).
DISTRIBUTION = re.compile(
    rf"^\s*(?:(?:torch-xla|optimum-tpu)(?![\w-])|{_NAME}\s*(?:\[|[<>=!~]=?|@|;))",
    re.IGNORECASE,
)
# A requirement where a requirement is expected (install_requires=[...], a requirements line).
REQUIREMENT = re.compile(rf"^\s*{_NAME}\s*(?:$|[\[<>=!~@;,\s])", re.IGNORECASE)
# `pip install ... torch_xla[tpu]` / `pip3 install` / `python -m pip install` / `uv pip install`
# / `conda install` (notebook shell lines and magics).
_INSTALLER = r"\b(?:pip3?|conda|mamba|uv)\b.*\binstall\b"
_PACKAGE = rf"(?<![\w.-])({_NAME})(?![\w-])"  # the distribution, not part of a longer name
INSTALL = re.compile(rf"{_INSTALLER}.*?{_PACKAGE}", re.IGNORECASE)
# setup() / setuptools keywords whose strings are requirements.
REQUIREMENT_KEYWORDS = frozenset({"install_requires", "setup_requires", "tests_require", "extras_require"})

DEPENDENCY_FILES = ("requirements*.txt", "requirements*.in", "constraints*.txt", "pyproject.toml",
                    "setup.cfg", "environment*.yml", "environment*.yaml", "Pipfile")
# Requirement files kept in a directory of their own (`requirements/tpu.txt`, `reqs/dev.in`).
REQUIREMENT_DIRECTORIES = ("requirements", "requirements*", "reqs", "deps")
REQUIREMENT_SUFFIXES = (".txt", ".in")
# Container recipes: their `pip install` lines (`Dockerfile`, `Dockerfile.tpu`, `tpu.dockerfile`).
CONTAINER_FILES = ("Dockerfile", "Dockerfile.*", "*.dockerfile", "Containerfile")


def message(requirement: str) -> str:
    return (f"depends on torch_xla / optimum-tpu (`{requirement.strip()}`): TorchTPU replaces them; "
            "drop the requirement (and depend on TorchTPU) once no code imports torch_xla")


def is_dependency_file(path: str) -> bool:
    """Whether `scan_dependency_file` reads this file (by its name, or its directory's)."""
    name = os.path.basename(path)
    if _matches(name, DEPENDENCY_FILES + CONTAINER_FILES):
        return True
    directory = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return name.endswith(REQUIREMENT_SUFFIXES) and _matches(directory, REQUIREMENT_DIRECTORIES)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def scan_dependency_file(path: str, data: bytes) -> list[Manual]:
    """The TPU098 findings of a dependency file (requirements*.txt, pyproject.toml, setup.cfg,
    environment.yml, Pipfile): one per line that requires torch_xla (torch-xla) or optimum-tpu,
    at the requirement's column. Comments are ignored. Lines and columns are 1-based."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    toml = path.endswith((".toml", "Pipfile"))
    findings = []
    if _matches(os.path.basename(path), CONTAINER_FILES):  # `RUN pip install ... torch_xla[tpu]`
        lines = text.splitlines()
        for number, line in enumerate(lines, start=1):
            match = INSTALL.search(line.split("#", 1)[0]) or _continued_install(lines, number - 1)
            if match is not None:
                findings.append(Manual(CODE, number, match.start(1) + 1, message(match.group(1))))
        return findings
    for number, line in enumerate(text.splitlines(), start=1):
        code = line.split("#", 1)[0] if not toml else _toml_code(line)
        match = _requirement_in(code, toml)
        if match is not None:
            column, requirement = match
            findings.append(Manual(CODE, number, column + 1, message(requirement)))
    return findings


def _continued_install(lines: list[str], index: int):
    """A torch_xla requirement on a continuation line of a `pip install ... \\` command."""
    start = index
    while start > 0 and lines[start - 1].rstrip().endswith("\\"):
        start -= 1
    if start == index or not re.search(_INSTALLER, lines[start]):
        return None
    return re.search(_PACKAGE, lines[index].split("#", 1)[0], re.IGNORECASE)


def _requirement_in(code: str, toml: bool) -> tuple[int, str] | None:
    """(0-based column, requirement) of a torch_xla requirement on this line, else None."""
    if toml:
        # `"torch_xla[tpu]~=2.5",` in a dependencies array, or `torch-xla = "^2.5"` (Poetry, Pipfile).
        for quoted in re.finditer(r"([\"'])(.*?)\1", code):
            if REQUIREMENT.match(quoted.group(2)):
                return quoted.start(2), quoted.group(2)
        key = re.match(rf"^\s*({_NAME})\s*=", code, re.IGNORECASE)
        return (key.start(1), code.strip()) if key is not None else None
    # A requirements line; setup.cfg's indented `install_requires` lines; `- torch_xla` in an
    # environment.yml (under `pip:` too).
    body = code.lstrip()
    column = len(code) - len(body)
    while body.startswith("- "):
        trimmed = body[2:].lstrip()
        column += len(body) - len(trimmed)
        body = trimmed
    if REQUIREMENT.match(body):
        return column, body.strip()
    return None


def _toml_code(line: str) -> str:
    """A TOML line without its comment (a `#` inside a string is kept)."""
    out, quote = [], None
    for char in line:
        if quote is None and char == "#":
            break
        if char in "\"'":
            quote = None if quote == char else (char if quote is None else quote)
        out.append(char)
    return "".join(out)


def install_line(text: str) -> tuple[int, str] | None:
    """(0-based column, package) of a torch_xla install in a shell line or magic
    (`!pip install torch_xla[tpu]`, `%pip install torch-xla`), else None."""
    match = INSTALL.search(text)
    return (match.start(1), match.group(1)) if match else None
