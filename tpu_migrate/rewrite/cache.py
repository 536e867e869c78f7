"""The result cache of `rewrite`: a file whose bytes were seen before is not parsed again.

One JSON file per key in the user's cache directory ($TPU_MIGRATE_CACHE_DIR, else
$XDG_CACHE_HOME/tpu-migrate, else ~/.cache/tpu-migrate). The key is the tool's code (the package
version and the bytes of the source files a result depends on), the rule tables (the bytes of
rules/*.toml, wherever TPU_MIGRATE_RULES_DIR points), libcst's and Python's versions, and the
options that change a result (target, select, ignore, fix level, max file size): any change
starts a new file.

An entry maps a file's absolute path to the blake2b digest of the bytes that were processed and
what processing them gave: no change and no findings, or the findings and whether the file would
change. A file the byte pre-filter rejects is clean whatever its bytes, so its entry has no
digest. Nothing is stored for a file with an error, nor for a file that a write run changes.
A file is read again (and hashed, when the pre-filter lets it through) unless its size, mtime,
ctime and inode are those recorded when it was read and both times were then over 2 s old, so a
change within one timestamp tick cannot go unseen (and `touch -d` still moves ctime).

Writes go to a temporary file renamed over the cache file, merged with what another run may have
written meanwhile: the last writer wins for a path, nothing is ever half-written. A cache file
that cannot be read or parsed is ignored and rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tpu_migrate import __version__
from tpu_migrate.findings import FileResult, Fix, KeptImport, Manual, Note
from tpu_migrate.rewrite.files import prefilter, read_regular, remove_quietly
from tpu_migrate.rules import rules_dir

FORMAT = 3  # 2: entries carry the notes (warnings) of a file; 3: and the torch_xla imports
ENTRY_LENGTH = 12
CLEAN = [None, False, [], [], [], False, []]  # an entry's fields from the digest on: a clean file
TRUST_MARGIN_NS = 2_000_000_000
MAX_ENTRIES = 500_000  # beyond this, entries not seen by the current run are dropped
MAX_HELD_BYTES = 128 << 20  # source bytes held for the workers at once (see `cached_results`)
STALE_AFTER_S = 30 * 24 * 3600  # cache files of other keys unused this long are deleted
PACKAGE = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    override = os.environ.get("TPU_MIGRATE_CACHE_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "tpu-migrate"


def disabled_by_env() -> bool:
    return os.environ.get("TPU_MIGRATE_NO_CACHE", "").strip().lower() in ("1", "true", "yes", "on")


def code_hash() -> str:
    """The tool's own code and data: changes when a rule file or a source file that the results
    depend on (the rewrite engine, the rules loader, the result model) changes."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{FORMAT}\0{__version__}\0{sys.implementation.name}\0{sys.version}\0".encode())
    sources = [PACKAGE / name for name in ("__init__.py", "findings.py", "rules.py")]
    sources += sorted((PACKAGE / "rewrite").rglob("*.py"))
    rules = rules_dir()
    sources += sorted(rules.glob("*.toml"))
    spec = importlib.util.find_spec("libcst")
    if spec is not None and spec.submodule_search_locations:
        sources.append(Path(next(iter(spec.submodule_search_locations))) / "_version.py")
    for path in sources:
        try:
            data = path.read_bytes()
        except OSError:
            data = b"\0missing"
        digest.update(f"\0{path.name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def settings_hash(settings: Mapping[str, object]) -> str:
    text = json.dumps(settings, sort_keys=True, default=sorted)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class Fingerprint:
    """What identifies the bytes read from a file (stat taken on the open file, before reading)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    digest: str | None  # None: the byte pre-filter rejects the file (it is clean)
    trusted: bool  # stat alone may vouch for these bytes next time


def read_fingerprinted(path: str, real: str | None = None) -> tuple[bytes, Fingerprint]:
    started = time.time_ns()
    # A file replaced by a FIFO since it was stat'ed is refused, not waited on; one swapped for a
    # link since it was found (`real`: files.read_regular) is not followed.
    data, st = read_regular(path, real)
    trusted = max(st.st_mtime_ns, st.st_ctime_ns) < started - TRUST_MARGIN_NS
    # A file the byte pre-filter rejects is clean whatever its bytes: no digest to compute.
    digest = hashlib.blake2b(data, digest_size=16).hexdigest() if prefilter(data) else None
    return data, Fingerprint(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, digest, trusted)


class Lookup(NamedTuple):
    result: FileResult | None  # a hit
    data: bytes | None = None  # a miss: the bytes read, when they could be read
    fingerprint: Fingerprint | None = None


class Cache:
    """Entries: absolute path -> [size, mtime_ns, ctime_ns, inode, trusted, digest, changed,
    fixes [[code, line, col, cell]], manual [[code, line, col, message, cell]],
    notes [[line, message, cell]], imports_xla, kept imports [[line, module, cell]]]."""

    def __init__(self, path: Path | None, entries: dict):
        self.path = path
        self._entries = entries
        self._touched: set[str] = set()
        self._cwd = os.getcwd()
        self.hits = 0
        self.misses = 0

    @classmethod
    def open(cls, settings: Mapping[str, object], directory: Path | None = None) -> Cache:
        try:
            directory = directory or cache_dir()
        except RuntimeError:  # no home directory to be found: work without a cache
            return cls(None, {})
        path = directory / f"rewrite-{__version__}-{code_hash()[:16]}-{settings_hash(settings)}.json"
        entries = _load(path)
        if entries:
            try:  # in use: keep it from looking stale to `_prune` when no run needs to rewrite it
                if time.time() - path.stat().st_mtime > 24 * 3600:
                    os.utime(path)
            except OSError:
                pass
        return cls(path, entries)

    def lookup(self, path: str, need_output: bool = False, real: str | None = None) -> Lookup:
        """The cached result for `path`, or the file's bytes and fingerprint to process and store.

        A file that the byte pre-filter rejects needs no entry to be answered (it is clean); it
        gets one anyway, so the next run need not even read it while its stat is unchanged.

        `need_output`: the caller needs the new bytes of a file that changes (write, diff), so a
        cached "would change" is a miss. `real`: where the file was found (files.read_regular).
        """
        key = self._key(path)
        entry = self._entries.get(key)
        try:
            st = os.stat(path)
        except OSError:
            self.misses += 1
            return Lookup(None)  # the engine reports it
        if not stat.S_ISREG(st.st_mode):
            self.misses += 1
            return Lookup(None)
        if (type(entry) is list and len(entry) == ENTRY_LENGTH and entry[4] is True
                and entry[:4] == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]):
            result = _result(path, entry, need_output)
            if result is not None:
                self.hits += 1
                return Lookup(result)
        try:
            data, fingerprint = read_fingerprinted(path, real)
        except OSError:
            self.misses += 1
            return Lookup(None)
        valid = type(entry) is list and len(entry) == ENTRY_LENGTH
        if fingerprint.digest is None:
            result = FileResult(path)
            if valid and entry[5:] == CLEAN:
                self.hits += 1
            else:
                self.misses += 1
            if entry != [*_stat_fields(fingerprint), *CLEAN]:
                self.store(path, fingerprint, result)
            return Lookup(result)
        if valid and entry[5] == fingerprint.digest:
            result = _result(path, entry, need_output)
            if result is not None:
                self.hits += 1
                if entry[:5] != _stat_fields(fingerprint):  # remember the new stat
                    self._entries[key] = [*_stat_fields(fingerprint), *entry[5:]]
                    self._touched.add(key)
                return Lookup(result)
        self.misses += 1
        return Lookup(None, data, fingerprint)

    def store(self, path: str, fingerprint: Fingerprint, result: FileResult) -> None:
        if result.error is not None:
            return
        key = self._key(path)
        self._entries[key] = [
            *_stat_fields(fingerprint), fingerprint.digest, result.changed,
            [[f.code, f.line, f.col, f.cell] for f in result.fixes],
            [[m.code, m.line, m.col, m.message, m.cell] for m in result.manual],
            [[n.line, n.message, n.cell] for n in result.notes],
            result.imports_xla,
            [[k.line, k.module, k.cell] for k in result.kept_imports],
        ]
        self._touched.add(key)

    def _key(self, path: str) -> str:
        return os.path.normpath(os.path.join(self._cwd, path))  # os.path.abspath, minus a getcwd

    def save(self) -> None:
        """Write the entries (merged with the file as it is now); errors are ignored."""
        if not self._touched or self.path is None:
            return
        on_disk = _load(self.path)
        merged = {key: entry for key, entry in {**self._entries, **on_disk}.items()
                  if type(entry) is list and len(entry) == ENTRY_LENGTH}
        for key in self._touched:
            merged[key] = self._entries[key]
        if len(merged) > MAX_ENTRIES:
            merged = {key: self._entries[key] for key in self._touched}
        directory = self.path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump({"format": FORMAT, "files": merged}, handle, separators=(",", ":"))
                os.replace(tmp, self.path)
            except BaseException:
                remove_quietly(tmp)
                raise
        except OSError:
            return
        self._touched.clear()
        _prune(directory, keep=self.path)


def _stat_fields(fingerprint: Fingerprint) -> list:
    return [fingerprint.size, fingerprint.mtime_ns, fingerprint.ctime_ns, fingerprint.inode, fingerprint.trusted]


def _result(path: str, entry: list, need_output: bool) -> FileResult | None:
    changed, fixes, manual, notes, imports_xla, kept = entry[6:]
    if changed is not False and (changed is not True or need_output):
        return None
    if entry[6:] == CLEAN[1:]:
        return FileResult(path)  # most files
    if type(imports_xla) is not bool:
        return None
    try:
        result = FileResult(
            path, changed=changed,
            fixes=[Fix(code, line, col, cell) for code, line, col, cell in fixes],
            manual=[Manual(code, line, col, message, cell=cell) for code, line, col, message, cell in manual],
            notes=[Note(line, message, cell) for line, message, cell in notes],
            imports_xla=imports_xla,
            kept_imports=[KeptImport(line, module, cell) for line, module, cell in kept],
        )
    except (TypeError, ValueError):  # a damaged entry: process the file again
        return None
    for finding in (*result.fixes, *result.manual):
        if not (_placed(finding) and type(finding.code) is str and type(finding.col) is int
                and type(getattr(finding, "message", "")) is str):
            return None
    if not (all(_placed(n) and type(n.message) is str for n in result.notes)
            and all(_placed(k) and type(k.module) is str for k in result.kept_imports)):
        return None
    return result


def _placed(item: Fix | Manual | Note | KeptImport) -> bool:
    return type(item.line) is int and (item.cell is None or type(item.cell) is int)


def _load(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return {}
    files = document.get("files")
    return files if isinstance(files, dict) else {}


def _prune(directory: Path, keep: Path) -> None:
    """Delete other keys' cache files unused for a month, and temporary files a crash left."""
    now = time.time()
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        path = directory / name
        if path == keep or not name.endswith((".json", ".tmp")) or "rewrite-" not in name:
            continue
        try:
            age = now - path.stat().st_mtime
        except OSError:
            continue
        if age > (STALE_AFTER_S if name.endswith(".json") else 24 * 3600):
            remove_quietly(path)


def cached_results(
    files: Iterable[str], cache: Cache,
    process: Callable[[list[str], dict[str, bytes]], Iterable[FileResult]],
    need_output: bool, store_changed: bool, reals: Mapping[str, str] | None = None,
) -> Iterator[FileResult]:
    """Results for `files`, in order: from the cache (or the byte pre-filter, see `lookup`), or
    from `process(paths, sources)` for the rest (`sources`: the bytes read here, which are the
    bytes the fingerprint vouches for; a file without them is read by the engine and not
    stored). `store_changed`: also store results that would change the file. `reals`: where each
    file was found (files.read_regular)."""
    reals = reals or {}
    files = list(files)
    slots: list[FileResult | None] = [None] * len(files)
    todo: list[int] = []
    sources: dict[str, bytes] = {}
    fingerprints: dict[int, Fingerprint] = {}
    held = 0
    for index, path in enumerate(files):
        found = cache.lookup(path, need_output, reals.get(path))
        if found.result is not None:
            slots[index] = found.result
        else:
            todo.append(index)
            if found.data is not None and held + len(found.data) <= MAX_HELD_BYTES:
                held += len(found.data)
                sources[path] = found.data
                fingerprints[index] = found.fingerprint
    done = 0
    while done < len(files) and slots[done] is not None:
        yield slots[done]
        done += 1
    # Largest first: a big file started last would keep one worker busy after the others finish.
    todo.sort(key=lambda i: -len(sources.get(files[i], b"")))
    for index, result in zip(todo, process([files[i] for i in todo], sources) if todo else ()):
        slots[index] = result
        if index in fingerprints:
            result.inode = fingerprints[index].inode
        if index in fingerprints and (store_changed or not result.changed):
            cache.store(files[index], fingerprints[index], result)
        while done < len(files) and slots[done] is not None:
            yield slots[done]
            done += 1


__all__ = ["Cache", "cache_dir", "cached_results", "disabled_by_env"]
