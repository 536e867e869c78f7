"""Finding files, reading them faithfully, the cheap pre-filter, and atomic writes."""

from __future__ import annotations

import errno
import fnmatch
import io
import os
import re
import secrets
import stat
import tempfile
import time
import tokenize
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from tpu_migrate.rewrite.dependencies import is_dependency_file

SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", ".venv", "venv", "build", "dist", "site-packages", "__pycache__",
     ".tox", ".nox", ".mypy_cache", ".pytest_cache", "node_modules"}
)


# Every rule needs one of these: torch_xla / optimum.tpu imports and "xla" strings, torch_xla's
# environment variables (PJRT_DEVICE, XRT_TPU_CONFIG, XLA_USE_BF16), HF availability checks.
# And a `# TODO(tpu-migrate): ...` comment left by an earlier run is open manual work to report.
# `torch.accelerator.current_accelerator`: the portable target's device (a tree it migrated,
# checked again with the tpu target: TPU130's torch.compile on that device).
_MARKERS = (b"xla", b"optimum", b"XLA_", b"PJRT_", b"XRT_", b"TPU_NUM_DEVICES", b"tpu_available",
            b"TODO(tpu-migrate)", b"current_accelerator")


def prefilter(data: bytes) -> bool:
    """False when the file cannot contain a torch_xla / optimum.tpu idiom or an open TODO of
    ours: skip parsing it.

    Matching bytes avoids decoding; a file without any marker has nothing any rule could change.
    """
    return any(marker in data for marker in _MARKERS)


# Temporary files of `write_atomic`: `.<name>.<pid>.<random>.tpu-migrate`, beside the file. A run
# killed while writing (SIGKILL, power loss) can leave one; the next writing run removes it.
TEMP_SUFFIX = ".tpu-migrate"
_TEMP_NAME = re.compile(r"^\.(?P<name>.+?)\.(?:(?P<pid>\d+)\.)?[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX) + "$")
_STALE_AFTER_S = 3600  # a temporary file this old is stale even if its pid is alive (pid reuse)


def is_stale_temp(directory: str, name: str) -> bool:
    """True for a temporary file of `write_atomic` whose writer is gone (or that is an hour old).

    A live run's own temporary file lasts milliseconds; its writer is identified by the pid in
    its name, so two runs at once do not remove each other's.
    """
    match = _TEMP_NAME.match(name)
    if match is None or not match["name"].endswith((".py", ".ipynb")):
        return False
    try:
        age = time.time() - os.lstat(os.path.join(directory, name)).st_mtime
    except OSError:
        return False
    if age > _STALE_AFTER_S:
        return True
    pid = int(match["pid"]) if match["pid"] else None
    if pid is None:
        return False  # an older version's file: only by age
    if pid == os.getpid():
        return True  # discovery runs before this process writes: a dead namesake left it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: alive, someone else's
        return False
    return False


def remove_quietly(path: str | os.PathLike) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # gone already, or not ours to fight over (it stays ignored)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _skipped_below(real: str, root: str) -> bool:
    parts = os.path.relpath(real, root).split(os.sep)[:-1]
    return any(p in SKIP_DIRS or p.endswith(".egg-info") for p in parts)


class Excluder:
    """`exclude` globs, each matched against a path's name or its path relative to a base
    directory (the pyproject.toml's directory for the configuration, the working directory for
    `--exclude`), however the path was spelled on the command line (`.`, `./src`, absolute).

    A pattern given as an absolute path is matched against the absolute path.

    The patterns are compiled once into one matcher per base (a set of the plain names and
    paths, one regular expression of the globs): a path costs a few lookups, not one match
    per pattern (5,000 files and 5,000 patterns took two minutes pattern by pattern)."""

    def __init__(self, patterns: Iterable[tuple[str, str]] = ()):
        # (pattern, absolute base); `./x` and `x/` mean `x`, as a user writes them.
        self._patterns = [(self._clean(p), os.path.abspath(base)) for p, base in patterns if self._clean(p)]
        self._absolute = _Globs(pattern for pattern, _ in self._patterns)
        by_base: dict[str, list[str]] = {}
        for pattern, base in self._patterns:
            by_base.setdefault(base, []).append(pattern)
        self._bases = [(base, _Globs(globs)) for base, globs in by_base.items()]

    @staticmethod
    def _clean(pattern: str) -> str:
        pattern = pattern.strip().rstrip("/")
        while pattern.startswith("./"):
            pattern = pattern[2:]
        return pattern

    def __bool__(self) -> bool:
        return bool(self._patterns)

    def matches(self, path: str) -> bool:
        """True when `path` (a file or directory, relative to the working directory or
        absolute) matches a pattern by name or by its path."""
        return bool(self._patterns) and self._match(os.path.abspath(path), ancestor=False)

    def matches_named(self, path: str) -> bool:
        """For a path named on the command line: it, or a directory above it inside a pattern's
        base, matches (what searching from there would have skipped; pre-commit names files one
        by one). Directories above the base are not looked at: `build` must not exclude a whole
        checkout that happens to live under a `build` directory."""
        if not self._patterns:
            return False
        absolute = os.path.abspath(path)
        if self._match(absolute, ancestor=False):
            return True
        parent = os.path.dirname(absolute)
        while parent != absolute:
            if self._match(parent, ancestor=True):
                return True
            absolute, parent = parent, os.path.dirname(parent)
        return False

    def _match(self, absolute: str, ancestor: bool) -> bool:
        if self._absolute.match(absolute):
            return True
        name = os.path.basename(absolute)
        for base, globs in self._bases:
            relative = os.path.relpath(absolute, base)
            inside = relative != os.curdir and relative != os.pardir and not relative.startswith(os.pardir + os.sep)
            if ancestor and not inside:
                continue
            if globs.match(name) or (inside and globs.match(relative)):
                return True
        return False


class _Globs:
    """Globs as `fnmatch.fnmatch` reads them, matched together. A text costs about one lookup
    per character, however many globs there are: the globs without a wildcard are a set; the
    others are indexed by three characters of the text they require (a run of plain characters
    in them, the rarest three of it), so that only the few whose characters the text holds are
    tried; the globs with no such run (`*`, `a?`) are joined into one regular expression."""

    GRAM = 3

    def __init__(self, patterns: Iterable[str]):
        self._plain: set[str] = set()
        runs: list[tuple[str, str]] = []  # (glob, its longest run of plain characters)
        short: list[str] = []
        for pattern in dict.fromkeys(os.path.normcase(p) for p in patterns):
            literals = _plain_runs(pattern)
            if literals is None:
                self._plain.add(pattern)
                continue
            longest = max(literals, key=len, default="")
            (runs.append((pattern, longest)) if len(longest) >= self.GRAM else short.append(pattern))
        counts: dict[str, int] = {}
        for _, run in runs:
            for gram in _grams(run, self.GRAM):
                counts[gram] = counts.get(gram, 0) + 1
        self._indexed: dict[str, list[re.Pattern]] = {}
        for pattern, run in runs:
            rarest = min(_grams(run, self.GRAM), key=lambda gram: counts[gram])
            self._indexed.setdefault(rarest, []).append(re.compile(fnmatch.translate(pattern)))
        self._short = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in short)) if short else None

    def match(self, text: str) -> bool:
        text = os.path.normcase(text)
        if text in self._plain or (self._short is not None and self._short.match(text) is not None):
            return True
        if self._indexed:
            for gram in dict.fromkeys(_grams(text, self.GRAM)):
                for glob in self._indexed.get(gram, ()):
                    if glob.match(text) is not None:
                        return True
        return False


def _grams(text: str, size: int) -> Iterator[str]:
    return (text[i:i + size] for i in range(len(text) - size + 1))


def _plain_runs(pattern: str) -> list[str] | None:
    """The runs of plain characters of a glob, read as fnmatch.translate reads it (`[...]` a
    class, a `[` without its `]` a plain character); None when it has no wildcard at all."""
    runs, run, wild, i, n = [], [], False, 0, len(pattern)
    while i < n:
        char = pattern[i]
        i += 1
        if char in "*?":
            wild = True
            runs.append("".join(run))
            run = []
        elif char == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                run.append(char)  # no class: a plain "["
            else:
                wild = True
                runs.append("".join(run))
                run = []
                i = j + 1
        else:
            run.append(char)
    runs.append("".join(run))
    return runs if wild else None


def shown(path: str) -> str:
    """How every report names `path`, as a diff's headers do (`a/src/x.py`): relative to the
    working directory, in `/` form, when it lies inside it (`./src/x.py`, `src//x.py` and an
    absolute spelling all read `src/x.py`), else absolute."""
    try:
        cwd = os.getcwd()
    except OSError:  # the working directory was removed: as spelled
        return path
    absolute = os.path.normpath(os.path.join(cwd, path))
    relative = os.path.relpath(absolute, cwd)
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return absolute
    return relative.replace(os.sep, "/")


# Suffixes of the Python files a named path may be (a script without one included).
PYTHON_SUFFIXES = ("", ".py", ".pyw", ".pyi")


def _not_python(path: str) -> str | None:
    """The error of a file named on the command line that is no Python file, notebook or
    dependency file (`notes.txt`): reported, not parsed, even where its text happens to parse."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix in PYTHON_SUFFIXES or suffix == ".ipynb" or is_dependency_file(path):
        return None
    return f"not a Python file or notebook ({suffix} file); nothing to rewrite"


# The error of a path named on the command line that does not exist: reported, not scanned.
MISSING = "no such file or directory"


def discover(
    paths: Iterable[str], exclude: Excluder | Iterable[str] = (), clean_temp_files: bool = False,
    on_excluded: Callable[[str], None] | None = None, on_unscanned: Callable[[str], None] | None = None,
    reals: dict[str, str] | None = None,
) -> Iterator[tuple[str, str | None]]:
    """Yield (path, error) for every Python file under `paths`, in a stable order, each path as
    reports name it (`shown`).

    Explicitly named files are taken whatever their suffix (a named symlink is followed);
    directories are searched for *.py and *.ipynb, and for the dependency files that may still
    install torch_xla (requirements*.txt, pyproject.toml, ...: dependencies.DEPENDENCY_FILES),
    skipping virtual environments, build output and VCS folders. `exclude` (an Excluder; plain
    globs are relative to the working directory) skips what matches, named paths included.

    Symlinks inside a searched directory: a linked directory is never entered (its files, when it
    points into the tree, are found where they are; this also makes loops harmless), and a linked
    file is taken only when its target lies inside the directory given, so nothing outside the
    tree is ever rewritten. A file reached twice (a link and its target) is taken once.
    A directory that cannot be listed is an error.

    `clean_temp_files`: remove the stale temporary files of an earlier run that was killed while
    writing (see `is_stale_temp`), in the directories searched and beside the files named.
    `on_excluded(path)`: told of each path named in `paths` that `exclude` skips.
    `on_unscanned(path)`: told of each other file a searched directory holds (not excluded, not
    a link): what the run does not rewrite (unscanned.py looks for torch_xla in it).
    `reals`: filled with each file's real path as found (no link in it), for `read_regular` and
    `write_atomic`: the file they open is then the one found here, whatever is swapped for a
    link in between.
    """
    if not isinstance(exclude, Excluder):
        exclude = Excluder((pattern, os.curdir) for pattern in exclude)
    excluded = exclude.matches
    seen: set[str] = set()
    swept: set[str] = set()

    def sweep(directory: str, names: Iterable[str]) -> None:
        for name in names:
            if name.endswith(TEMP_SUFFIX) and is_stale_temp(directory, name):
                remove_quietly(os.path.join(directory, name))

    for raw in paths:
        if not os.path.lexists(raw):
            yield raw, MISSING  # as spelled: it names an argument, not a file
            continue
        if not os.path.isdir(raw):
            real = os.path.realpath(raw)
            if clean_temp_files and os.path.dirname(real) not in swept:
                directory = os.path.dirname(real)
                swept.add(directory)
                try:
                    sweep(directory, os.listdir(directory))
                except OSError:
                    pass
            if exclude.matches_named(raw):
                if on_excluded is not None:
                    on_excluded(shown(raw))
            elif real not in seen:
                seen.add(real)
                if reals is not None:
                    reals[shown(raw)] = real
                yield shown(raw), _not_python(raw) or _unreachable(raw)
            continue
        if exclude.matches_named(raw):
            if on_excluded is not None:
                on_excluded(shown(raw))
            continue
        root_real = os.path.realpath(raw)
        # (path as shown, its real path) of the directories still to search, depth first.
        stack = [(raw, root_real)]
        links: list[tuple[str, str]] = []  # in-tree file links: after the files themselves
        while stack:
            directory, real_dir = stack.pop()
            try:
                with os.scandir(directory) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as exc:
                yield shown(directory), f"cannot read directory: {exc.strerror or exc}"
                continue
            if clean_temp_files and real_dir not in swept:
                swept.add(real_dir)
                sweep(directory, (e.name for e in entries))
            subdirs = []
            for entry in entries:
                name = entry.name
                try:
                    link = entry.is_symlink()
                    is_dir = not link and entry.is_dir(follow_symlinks=False)
                except OSError:
                    link = is_dir = False
                if is_dir:
                    if name not in SKIP_DIRS and not name.endswith(".egg-info") and not excluded(entry.path):
                        subdirs.append((entry.path, os.path.join(real_dir, name)))
                    continue
                if not (name.endswith((".py", ".ipynb")) or is_dependency_file(entry.path)):
                    if on_unscanned is not None and not link and not excluded(entry.path):
                        on_unscanned(shown(entry.path))
                    continue
                if excluded(entry.path):
                    continue
                if link:
                    real = os.path.realpath(entry.path)
                    if _inside(real, root_real) and not os.path.isdir(real) and not _skipped_below(real, root_real):
                        links.append((entry.path, real))
                    continue  # else: outside the tree, a directory, or into .venv & co: not followed
                real = os.path.join(real_dir, name)
                if real not in seen:
                    seen.add(real)
                    if reals is not None:
                        reals[shown(entry.path)] = real
                    yield shown(entry.path), None
            stack.extend(reversed(subdirs))
        for path, real in links:
            if real not in seen:
                seen.add(real)
                if reals is not None:
                    reals[shown(path)] = real
                yield shown(path), _unreachable(path)  # a dangling or looping link: an error


def _unreachable(path: str) -> str | None:
    """The error of a link that leads nowhere (dangling, or a loop): found, not read."""
    try:
        os.stat(path)
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    return None


def read_source(path: str, real: str | None = None) -> bytes:
    """The bytes of a regular file. A FIFO or device is refused without blocking on it (OSError
    "not a regular file"); a directory raises IsADirectoryError. `real`: see `read_regular`."""
    return read_regular(path, real)[0]


class ChangedOnDisk(OSError):
    """The file is no longer the bytes the new content was computed from."""


class Replaced(ChangedOnDisk):
    """A path found in the tree leads through a link now: not followed."""


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
REPLACED = ("it, or a directory on its path, was replaced by a symbolic link (or another kind of file) since "
            "the search found it; not followed, left alone")


def open_directory(real_dir: str) -> int:
    """A file descriptor of the directory `real_dir`, an absolute path without links (a real
    path as `discover` found it), opened one component at a time without following a link: a
    component swapped for a link (or for a file) since raises `Replaced` instead of leading
    elsewhere."""
    fd = os.open(os.sep, _DIRECTORY_FLAGS)
    try:
        for part in real_dir.split(os.sep):
            if part:
                try:
                    inner = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise Replaced(errno.ELOOP, REPLACED, real_dir) from None
                    raise
                os.close(fd)
                fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_in(directory_fd: int, name: str, flags: int) -> int:
    """`name` in the directory, never through a link."""
    try:
        return os.open(name, flags | _NOFOLLOW | _CLOEXEC, dir_fd=directory_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Replaced(errno.ELOOP, REPLACED, name) from None
        raise


def read_regular(path: str, real: str | None = None) -> tuple[bytes, os.stat_result]:
    """`read_source`, with the stat of the open file taken before reading (the result cache's
    fingerprint: what it says is what was read).

    `real`: the file's real path when it was found (`discover`'s `reals`). The file read is
    then the one at that path, reached without following any link: an in-tree file or directory
    swapped for a link since raises `Replaced` rather than read what the link points to."""
    if real is None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC)
    else:
        directory_fd = open_directory(os.path.dirname(real))
        try:
            fd = _open_in(directory_fd, os.path.basename(real), os.O_RDONLY | os.O_NONBLOCK)
        finally:
            os.close(directory_fd)
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return handle.read(), st


_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
# Files that mention torch_xla and are larger are reported, not parsed (--max-file-size):
# libcst needs about 15 s and 600 MB per MiB.
DEFAULT_MAX_FILE_SIZE = 1024 * 1024


def parse_size(text: str) -> int:
    """`1048576`, `500k`, `2M`, `1MiB`, `1MB` -> bytes (binary units); ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)(?:i?[bB])?\s*", text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (use e.g. 1048576, 500K, 2M)")
    return int(float(match[1]) * _UNITS[match[2].lower()])


def format_size(size: int) -> str:
    if size >= 1024**2:
        return f"{size / 1024**2:.1f} MiB"
    if size >= 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size} bytes"


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


def write_atomic(path: str, data: bytes, expected: bytes | None = None, inode: int | None = None,
                 real: str | None = None) -> None:
    """Replace `path` with `data` through a temporary file in the same directory.

    Readers see the old bytes or the new bytes, never a mix, and a crash at any point leaves the
    old file whole (at worst with a stale temporary file beside it, which `discover` removes on
    the next writing run). A symlink is written through (the link stays a link). Mode, owner and
    group are kept (owner: when allowed, i.e. as root; group: when a member), and so are its
    extended attributes (ACLs among them), or nothing is written. A file with several hard
    links is refused: a new file under one name would leave the others with the old text.
    `expected`: the bytes the new content was computed from, `inode`: the file they were read
    from; if the file no longer holds them (edited meanwhile), or the path no longer leads to
    that file (swapped for a link to another, say), nothing is written and ChangedOnDisk is
    raised.

    `real`: the real path the file was found at (`discover`'s `reals`; default: where `path`
    leads now). Its directory is opened one component at a time without following links
    (`open_directory`), and the temporary file, the checks and the rename all happen inside that
    directory, on names that are never followed: a file or directory swapped for a link since
    the search raises `Replaced`, and nothing outside the directory found is ever written.
    """
    target = real if real is not None else os.path.realpath(path)
    directory, name = os.path.split(target)
    directory_fd = open_directory(directory)
    try:
        _replace_in(directory_fd, name, data, expected, inode,
                    still_there=(lambda: os.path.realpath(path) == target) if real is None else (lambda: True))
    finally:
        os.close(directory_fd)


def replace_file(path: str, data: bytes) -> None:
    """Write `data` to `path` (a report, not a source file) through a temporary file beside
    it: a failure leaves what was there, or nothing, never an empty or partial file. A new file
    gets the mode open() would give it, an existing one keeps its own; a link is written
    through; a path that is no regular file (`/dev/stdout`, a FIFO) is written directly."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "wb") as handle:
            handle.write(data)
        return
    target = os.path.realpath(path)
    if st is not None:
        mode = stat.S_IMODE(st.st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                               dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        remove_quietly(tmp)
        raise


def _replace_in(directory_fd: int, name: str, data: bytes, expected: bytes | None, inode: int | None,
                still_there: Callable[[], bool]) -> None:
    current = _open_in(directory_fd, name, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(current, "rb") as old:
        st = os.fstat(current)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file; not written")
        if inode is not None and st.st_ino != inode:
            raise ChangedOnDisk(errno.EAGAIN, "the path leads to another file than the one read (replaced "
                                              "meanwhile); not written")
        _refuse_read_only(directory_fd, name, st)
        if st.st_nlink > 1:
            raise OSError(errno.EMLINK, f"it has {st.st_nlink} hard links, and a rewrite would leave the other "
                                        "names with the old text; not written (copy it to break the link)")
        short = name
        while len(os.fsencode(short)) > 200:  # names are 255 bytes at most; the end keeps the suffix
            short = short[1:]                  # `is_stale_temp` looks for
        tmp = None
        try:
            fd, tmp = _temporary_file(directory_fd, short)
            with os.fdopen(fd, "wb") as handle:
                _keep_owner(handle.fileno(), st)
                os.fchmod(handle.fileno(), stat.S_IMODE(st.st_mode))  # after chown, which drops setuid
                _keep_extended_attributes(handle.fileno(), current)
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())  # data and metadata on disk before the rename
            if expected is not None:
                old.seek(0)
                if old.read() != expected:
                    raise ChangedOnDisk(errno.EAGAIN, "the file changed on disk while it was being rewritten; "
                                                      "run again")
            # The last moment before the rename: the name must still be the file read.
            try:
                now = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not still_there():
                raise ChangedOnDisk(errno.EAGAIN, "the path was replaced while the file was being rewritten; "
                                                  "not written")
            os.replace(tmp, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
            tmp = None
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp, dir_fd=directory_fd)
                except OSError:
                    pass


def _temporary_file(directory_fd: int, name: str) -> tuple[int, str]:
    """A new file `.<name>.<pid>.<8 random characters>.tpu-migrate` in the directory (`is_stale_temp`
    knows the pattern), created exclusively and never through a link; only we may read it."""
    for _ in range(100):
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600,
                           dir_fd=directory_fd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name")


def _refuse_read_only(directory_fd: int, name: str, st: os.stat_result) -> None:
    """The rename would replace a file we may not write (it only needs the directory), so ask
    as open() would; and a file with no write bit at all was made read-only on purpose, which
    root's open() would ignore."""
    if not st.st_mode & 0o222 or not os.access(name, os.W_OK, dir_fd=directory_fd):
        raise PermissionError(errno.EACCES, "Permission denied (the file is read-only)", name)


def _keep_extended_attributes(fd: int, target: int | str) -> None:
    """Copy `target`'s (a file descriptor, or a path) extended attributes (user metadata, POSIX ACLs, SELinux labels) to the new
    file; one that cannot be copied stops the write rather than be dropped."""
    if not hasattr(os, "listxattr"):
        return
    try:
        names = os.listxattr(target)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return
        raise
    for name in names:
        try:
            os.setxattr(fd, name, os.getxattr(target, name))
        except OSError as exc:
            raise OSError(exc.errno, f"cannot keep its extended attribute {name} "
                                     f"({exc.strerror or exc}); not written") from None


def _keep_owner(fd: int, st: os.stat_result) -> None:
    mine = os.fstat(fd)
    if (mine.st_uid, mine.st_gid) == (st.st_uid, st.st_gid):
        return
    try:
        os.fchown(fd, st.st_uid, st.st_gid)  # root, or the same owner with another group
    except PermissionError:
        try:
            os.fchown(fd, -1, st.st_gid)  # not root: keep at least the group, when a member
        except PermissionError:
            pass


__all__ = ["MISSING", "prefilter", "discover", "shown", "Excluder", "decode", "encode", "write_atomic", "read_source", "read_regular",
           "open_directory", "replace_file", "remove_quietly", "parse_size",
           "format_size", "is_stale_temp", "DecodeError", "ChangedOnDisk", "Replaced"]
