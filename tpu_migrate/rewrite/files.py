"""Finding files, reading them faithfully, the cheap pre-filter, and atomic writes."""

from __future__ import annotations

import fnmatch
import io
import os
import tempfile
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", ".venv", "venv", "build", "dist", "site-packages", "__pycache__",
     ".tox", ".nox", ".mypy_cache", ".pytest_cache", "node_modules"}
)


# Every rule needs one of these: torch_xla / optimum.tpu imports and "xla" strings, torch_xla's
# environment variables (PJRT_DEVICE, XRT_TPU_CONFIG, XLA_USE_BF16), HF availability checks.
_MARKERS = (b"xla", b"optimum", b"XLA_", b"PJRT_", b"XRT_", b"TPU_NUM_DEVICES", b"tpu_available")


def prefilter(data: bytes) -> bool:
    """False when the file cannot contain a torch_xla / optimum.tpu idiom: skip parsing it.

    Matching bytes avoids decoding; a file without any marker has nothing any rule could change.
    """
    return any(marker in data for marker in _MARKERS)


def discover(paths: Iterable[str], exclude: Iterable[str] = ()) -> Iterator[tuple[str, str | None]]:
    """Yield (path, error) for every Python file under `paths`, in a stable order.

    Explicitly named files are taken whatever their suffix; directories are searched for *.py and
    *.ipynb,
    skipping virtual environments, build output and VCS folders. `exclude` globs match a
    path's name or its whole relative path.
    """
    patterns = list(exclude)
    seen: set[str] = set()

    def excluded(path: str) -> bool:
        name = os.path.basename(path)
        return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path, p) for p in patterns)

    for raw in paths:
        if not os.path.lexists(raw):
            yield raw, "no such file or directory"
            continue
        if os.path.isdir(raw):
            for root, dirs, files in os.walk(raw):
                dirs[:] = sorted(
                    d for d in dirs
                    if d not in SKIP_DIRS and not d.endswith(".egg-info")
                    and not excluded(os.path.join(root, d))
                )
                for name in sorted(files):
                    path = os.path.join(root, name)
                    if name.endswith((".py", ".ipynb")) and not excluded(path) and path not in seen:
                        seen.add(path)
                        yield path, None
        elif not excluded(raw) and raw not in seen:
            seen.add(raw)
            yield raw, None


@dataclass(frozen=True)
class SourceText:
    text: str
    encoding: str


class DecodeError(Exception):
    pass


def decode(data: bytes) -> SourceText:
    """Decode as Python would (PEP 263 cookie, BOM); `encode` gives the same bytes back."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        raise DecodeError(str(exc)) from None
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        raise DecodeError(f"cannot decode as {encoding}: {exc}") from None
    return SourceText(text, encoding)


def encode(text: str, encoding: str) -> bytes:
    return text.encode(encoding)


def write_atomic(path: str, data: bytes) -> None:
    """Replace `path` with `data` through a temporary file in the same directory.

    Readers see the old bytes or the new bytes, never a mix; the file's mode is kept.
    """
    target = Path(path)
    mode = target.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tpu-migrate", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


__all__ = ["prefilter", "discover", "decode", "encode", "write_atomic", "DecodeError"]
