"""`[tool.tpu-migrate]` in the nearest pyproject.toml, merged under the command-line flags.

    [tool.tpu-migrate]
    target = "tpu"            # or "portable"
    select = ["TPU0"]         # rule codes or prefixes
    ignore = ["TPU031"]
    exclude = ["legacy/*"]    # globs, like --exclude
    fix-level = "unsafe"      # or "safe": apply only safe fixes
    cache = true              # false: never read or write the result cache (like --no-cache)
    max-file-size = "4M"      # or bytes; 0: no limit (like --max-file-size)

The search starts at the first path (or the current directory) and goes up to the project's
root, as ruff's does: the first directory holding a pyproject.toml (its `[tool.tpu-migrate]`
table, if it has one, is the configuration), or else holding `.git`. It never reads above that:
a parent directory's settings (an `exclude` that matches everything, a broken file) are not the
project's. Unknown keys and bad values are errors naming them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tpu_migrate.rules import TomlError, loads_toml

KEYS = ("target", "select", "ignore", "exclude", "fix-level", "cache", "max-file-size")
TARGETS = ("tpu", "portable")
FIX_LEVELS = ("safe", "unsafe")


class ConfigError(Exception):
    pass


@dataclass
class Config:
    path: Path | None = None
    target: str | None = None
    select: list[str] | None = None
    ignore: list[str] | None = None
    exclude: list[str] = field(default_factory=list)
    fix_level: str | None = None
    cache: bool = True
    max_file_size: int | None = None  # bytes; None: not set


def project_root(paths: list[str]) -> Path:
    """Where the configuration search stops: the first directory at or above the first path
    holding a pyproject.toml or `.git`; the file system's root if none does."""
    start = Path(os.path.abspath(paths[0])) if paths else Path.cwd()
    while not start.exists() and start != start.parent:  # a missing path (a dangling link): its folder's
        start = start.parent
    start = start.resolve()
    directory = start if start.is_dir() else start.parent
    for candidate in (directory, *directory.parents):
        if (candidate / "pyproject.toml").is_file() or (candidate / ".git").exists():
            return candidate
    return Path(directory.anchor)


def find_config(paths: list[str]) -> Path | None:
    pyproject = project_root(paths) / "pyproject.toml"
    if pyproject.is_file() and "tpu-migrate" in _tool_tables(pyproject):
        return pyproject
    return None


def _tool_tables(pyproject: Path) -> dict:
    try:
        data = loads_toml(pyproject.read_text(encoding="utf-8"))
    except TomlError as exc:
        raise ConfigError(f"{pyproject}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{pyproject}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{pyproject}: cannot read: {exc.strerror or exc}") from None
    tool = data.get("tool", {})
    return tool if isinstance(tool, dict) else {}


def load_config(paths: list[str]) -> Config:
    pyproject = find_config(paths)
    if pyproject is None:
        return Config()
    table = _tool_tables(pyproject)["tpu-migrate"]
    where = f"{pyproject}: [tool.tpu-migrate]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    # Every problem of the table in one line, not the first one per run.
    problems = [f"unknown key '{key}' (known: {', '.join(KEYS)})" for key in table if key not in KEYS]
    config = Config(path=pyproject)

    def take(attribute: str, read, *args) -> None:
        try:
            setattr(config, attribute, read(table, *args))
        except ConfigError as exc:
            problems.append(str(exc))

    take("target", _choice, "target", TARGETS)
    take("fix_level", _choice, "fix-level", FIX_LEVELS)
    take("select", _strings, "select")
    take("ignore", _strings, "ignore")
    take("exclude", _strings, "exclude")
    take("cache", _flag, "cache")
    take("max_file_size", _size, "max-file-size")
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems))
    config.exclude = config.exclude or []
    return config


def _flag(table: dict, key: str) -> bool:
    value = table.get(key, True)
    if not isinstance(value, bool):
        raise ConfigError(f"'{key}' must be true or false, not {value!r}")
    return value


def _size(table: dict, key: str) -> int | None:
    from tpu_migrate.rewrite.files import parse_size

    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    try:
        if isinstance(value, str):
            return parse_size(value)
    except ValueError:
        pass
    raise ConfigError(f"'{key}' must be a size such as \"4M\", \"500K\" or a number of bytes, "
                      f"not {value!r}")


def _choice(table: dict, key: str, choices: tuple[str, ...]) -> str | None:
    value = table.get(key)
    if value is not None and value not in choices:
        raise ConfigError(f"'{key}' must be one of {', '.join(choices)}, not {value!r}")
    return value


def _strings(table: dict, key: str) -> list[str] | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"'{key}' must be a list of strings")
    return value
