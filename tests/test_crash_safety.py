"""Never lose data: `rewrite` killed at any moment leaves every file whole, and a re-run finishes.

The tool runs as a real subprocess on a tree of 500+ files and is SIGKILLed at seeded random
points of its run (and once, deterministically, in the middle of writing a file). After each kill
every file must hold either its original bytes or exactly its complete rewritten form; the only
other thing allowed is a temporary file of the killed writer, which the next writing run removes.
Also here: the symlink policy (nothing outside the tree is written) and mode/owner preservation.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT
from tpu_migrate.findings import FileResult
from tpu_migrate.rewrite.files import TEMP_SUFFIX, discover, is_stale_temp
from tpu_migrate.rewrite.pool import run_tasks

pytestmark = pytest.mark.slow  # SIGKILLed CLI runs over a 520-file tree

XLA = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nxm.mark_step()\n"
XLA_REWRITTEN = 'import torch\n\ndevice = torch.device("tpu")\n'
PLAIN = "import torch\n\n\ndef f{i}(x):\n    return torch.relu(x) * {i}\n"
FILES = 520
OTHER_UID = 4242

# The CLI with every fsync slowed down, so that a kill can be aimed at the moment a file's new
# content sits in its temporary file, before the rename.
SLOW_WRITER = (
    # Started as from a terminal: Ctrl-C delivered and Python's. The test worker's own state,
    # which a child inherits where SIGINT is ignored or blocked, is not what these tests are
    # about (in one full run every Ctrl-C test of a worker saw SIGINT do nothing: sigint_state).
    "import signal; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "import os, runpy, sys, time\n"
    "fsync = os.fsync\n"
    "os.fsync = lambda fd: (time.sleep(0.05), fsync(fd))[1]\n"
    "sys.argv = ['tpu-migrate', *sys.argv[1:]]\n"
    "runpy.run_module('tpu_migrate', run_name='__main__')\n"
)


def sigint_state() -> str:
    """This process's SIGINT as Python and the kernel see it (for a failure's message)."""
    with open("/proc/self/status", encoding="ascii") as handle:
        masks = {k: int(v, 16) for k, _, v in (line.partition(":") for line in handle) if k in ("SigIgn", "SigBlk")}
    return (f"test worker: SIGINT handler {signal.getsignal(signal.SIGINT)!r}, "
            f"ignored {bool(masks['SigIgn'] & 2)}, blocked {bool(masks['SigBlk'] & 2)}")


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def build_tree(root: Path) -> None:
    """Half torch_xla files (every rule's fixture inputs, CRLF and BOM variants, a notebook), half
    plain files, spread over 30 directories; some executable, some owned by another user."""
    cases = sorted(FIXTURES.glob("*/*.in.py"))
    for i in range(FILES):
        directory = root / f"pkg{i % 10}" / f"sub {i % 3}"  # a space in the path, on purpose
        directory.mkdir(parents=True, exist_ok=True)
        if i % 2:
            data = cases[i % len(cases)].read_bytes()
            if i % 7 == 1:
                data = data.replace(b"\n", b"\r\n")
            if i % 11 == 1:
                data = b"\xef\xbb\xbf" + data
            path = directory / f"xla_{i}.py"
        else:
            data = PLAIN.format(i=i).encode()
            path = directory / f"plain_{i}.py"
        path.write_bytes(data)
        if i % 13 == 1:
            path.chmod(0o755)
        if i % 17 == 1 and os.geteuid() == 0:
            os.chown(path, OTHER_UID, OTHER_UID)
    shutil.copyfile(ROOT / "fixtures" / "notebooks" / "train_xla.ipynb", root / "pkg0" / "nb.ipynb")


def snapshot(root: Path) -> dict[str, bytes]:
    files = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as handle:
                files[os.path.relpath(path, root)] = handle.read()
    return files


def metadata(root: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for rel in snapshot(root):
        st = os.stat(root / rel)
        out[rel] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    return out


def restore(root: Path, original: dict[str, bytes], meta: dict[str, tuple[int, int, int]]) -> None:
    if root.exists():
        shutil.rmtree(root)
    for rel, data in original.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        mode, uid, gid = meta[rel]
        os.chmod(path, mode)
        if os.geteuid() == 0:
            os.chown(path, uid, gid)


def start(root: Path, *args: str, slow: bool = False) -> subprocess.Popen:
    command = [sys.executable, "-c", SLOW_WRITER] if slow else [sys.executable, "-m", "tpu_migrate"]
    return subprocess.Popen(
        [*command, "rewrite", "--exit-zero", *args, str(root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env(), start_new_session=True,
    )


def kill(process: subprocess.Popen) -> None:
    """SIGKILL the run and its pool workers (its own process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def run_to_end(root: Path, *args: str) -> None:
    process = start(root, *args)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err.decode()


def check_after_kill(root: Path, original: dict[str, bytes], expected: dict[str, bytes]) -> tuple[int, list[str]]:
    """Every file whole (original or complete new form); leftovers only the killed writer's
    temporary files. Returns (files already rewritten, leftovers)."""
    now = snapshot(root)
    leftovers = sorted(rel for rel in now if rel.endswith(TEMP_SUFFIX))
    assert sorted(set(now) - set(leftovers)) == sorted(original)
    done = 0
    for rel, data in original.items():
        assert now[rel] in (data, expected[rel]), f"{rel} is neither its original nor its rewritten form"
        done += now[rel] != data
    for rel in leftovers:
        directory, name = os.path.split(root / rel)
        assert is_stale_temp(directory, name), rel  # the next writing run removes it
    return done, leftovers


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """(original tree, its metadata, the expected rewritten bytes, seconds a full run takes)."""
    base = tmp_path_factory.mktemp("crash")
    source = base / "source"
    build_tree(source)
    copy = base / "expected"
    restore(copy, snapshot(source), metadata(source))  # a copy with the owners too
    started = time.monotonic()
    run_to_end(copy, "--jobs", "1")
    elapsed = time.monotonic() - started
    expected = snapshot(copy)
    original = snapshot(source)
    assert len(original) > 500
    changed = sum(expected[rel] != original[rel] for rel in original)
    assert changed > 250, changed  # enough writing to kill into
    assert metadata(copy) == metadata(source)  # mode and owner kept by a plain run
    return source, metadata(source), original, expected, elapsed


def test_sigkill_at_random_points_never_leaves_a_partial_file(trees, tmp_path):
    source, meta, original, expected, elapsed = trees
    work = tmp_path / "work"
    rng = random.Random(20240806)
    partial = 0
    for attempt in range(4):  # twice with each --jobs
        restore(work, original, meta)
        jobs = "2" if attempt % 2 else "1"
        # Spread over the run: start-up (imports) takes the first fifth or so; writes follow.
        delay = rng.uniform(0.2, 1.0) * elapsed
        process = start(work, "--jobs", jobs)
        time.sleep(delay)
        kill(process)
        done, _ = check_after_kill(work, original, expected)
        partial += 0 < done < len(original)
        run_to_end(work, "--jobs", jobs)
        assert snapshot(work) == expected, f"attempt {attempt}: a re-run did not finish the job"
        assert metadata(work) == meta
    assert partial >= 1, "no kill landed while files were being written"


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sigkill_while_a_file_is_being_written(trees, tmp_path, jobs):
    """Aimed: kill while a temporary file exists (its fsync is slowed down), i.e. between the
    write of the new content and the rename. The file keeps its old bytes; the temporary file is
    recognised as stale, ignored by --check and removed by the next writing run."""
    _, meta, original, expected, _ = trees
    work = tmp_path / "work"
    restore(work, original, meta)
    process = start(work, "--jobs", jobs, slow=True)
    temp = wait_for_temporary_file(process, work)
    kill(process)
    assert temp is not None, "no temporary file seen"
    done, leftovers = check_after_kill(work, original, expected)
    assert leftovers, "killed during the fsync, the temporary file must still be there"
    assert done < len(original)
    # A run that writes nothing leaves it alone (and is not confused by it) ...
    check = subprocess.run([sys.executable, "-m", "tpu_migrate", "rewrite", "--check", "--exit-zero", str(work)],
                           capture_output=True, env=env(), timeout=120)
    assert check.returncode == 0, check.stderr.decode()
    assert TEMP_SUFFIX.encode() not in check.stdout + check.stderr
    assert check_after_kill(work, original, expected)[1] == leftovers
    # ... and the next writing run removes it and finishes the job.
    run_to_end(work, "--jobs", jobs)
    assert snapshot(work) == expected
    assert metadata(work) == meta


def wait_for_temporary_file(process, work, seconds: float = 60):
    """The first temporary file the slowed-down run is writing under `work`, or None if the run
    ended (or `seconds` passed) before one appeared."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        for directory, _, names in os.walk(work):
            temp = next((os.path.join(directory, n) for n in names if n.endswith(TEMP_SUFFIX)), None)
            if temp:
                return temp
        # Not a busy loop: it took a core from the run it waits for (and from the other test
        # worker) for the whole start-up; a temporary file lives 50 ms at least (SLOW_WRITER).
        time.sleep(0.01)
    return None


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("group", [True, False], ids=["terminal", "parent-only"])
def test_ctrl_c_while_a_file_is_being_written_exits_130_and_leaves_no_temporary_file(trees, tmp_path, jobs, group):
    """SIGINT (to the process group, as a terminal's Ctrl-C, or to the tool alone) while a
    temporary file exists: the file being written is finished (or left as it was), the run
    stops at once with 130 and one line, not click's "Aborted!" and 1, and nothing but whole
    files remains."""
    _, meta, original, expected, _ = trees
    work = tmp_path / "work"
    restore(work, original, meta)
    process = start(work, "--jobs", jobs, slow=True)
    temp = wait_for_temporary_file(process, work)
    assert temp is not None, "no temporary file seen"
    (os.killpg if group else os.kill)(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, (err.decode(), sigint_state())
    assert err.decode().splitlines() == [  # (no worker's or pool thread's traceback)
        "tpu-migrate: interrupted: the files written so far are rewritten, the others untouched"]
    done, leftovers = check_after_kill(work, original, expected)
    assert leftovers == [] and 1 <= done < len(original) // 2


def test_a_live_writers_temporary_file_is_not_removed(tmp_path):
    """Two runs at once must not delete each other's temporary files: the pid in the name tells
    whose it is. A dead writer's file goes, as does one an hour old (pid reuse)."""
    (tmp_path / "a.py").write_text(XLA)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".a.py.{sleeper.pid}.abcd1234{TEMP_SUFFIX}"
        live.write_bytes(b"half")
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        gone = tmp_path / f".a.py.{dead.pid}.abcd1234{TEMP_SUFFIX}"
        gone.write_bytes(b"half")
        old = tmp_path / f".a.py.abcdefgh{TEMP_SUFFIX}"  # an older version's name, no pid
        old.write_bytes(b"half")
        young = tmp_path / f".a.py.hgfedcba{TEMP_SUFFIX}"
        young.write_bytes(b"half")
        os.utime(old, (time.time() - 7200, time.time() - 7200))
        foreign = tmp_path / f".notes.txt.1.abcd1234{TEMP_SUFFIX}"  # not a Python file's: not ours
        foreign.write_bytes(b"keep")
        found = list(discover([str(tmp_path)], clean_temp_files=True))
        assert found == [(str(tmp_path / "a.py"), None)]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            ["a.py", live.name, young.name, foreign.name])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_symlinks_out_of_the_tree_are_never_followed(cli, tmp_path):
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    tree.mkdir()
    outside.mkdir()
    (outside / "theirs.py").write_text(XLA)
    (outside / "pkg").mkdir()
    (outside / "pkg" / "inner.py").write_text(XLA)
    (tree / "mine.py").write_text(XLA)
    (tree / "link_out.py").symlink_to(outside / "theirs.py")
    (tree / "linked_dir").symlink_to(outside / "pkg")
    (tree / "link_in.py").symlink_to(tree / "mine.py")  # inside: the target is rewritten once
    (tree / "loop").symlink_to(tree)  # a directory loop: never entered
    result = cli("rewrite", "--format", "json", str(tree))
    assert result.returncode == 0, result.stderr  # written, nothing left to do
    paths = [f["path"] for f in json.loads(result.stdout)["files"]]
    assert paths == [str(tree / "mine.py")]  # link_in.py is the same file: taken once
    assert (outside / "theirs.py").read_text() == XLA
    assert (outside / "pkg" / "inner.py").read_text() == XLA
    assert (tree / "mine.py").read_text() == XLA_REWRITTEN
    assert (tree / "link_in.py").is_symlink() and (tree / "link_out.py").is_symlink()


def test_a_named_symlink_is_written_through(cli, tmp_path):
    """A file named on the command line is taken even when it is a link; the target changes and
    the link stays a link."""
    (tmp_path / "real.py").write_text(XLA)
    (tmp_path / "alias.py").symlink_to("real.py")
    result = cli("rewrite", str(tmp_path / "alias.py"))
    assert result.returncode == 0, result.stderr  # written, nothing left to do
    assert (tmp_path / "alias.py").is_symlink()
    assert (tmp_path / "real.py").read_text() == XLA_REWRITTEN
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias.py", "real.py"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_owner_group_and_mode_are_kept(cli, tmp_path):
    path = tmp_path / "owned.py"
    path.write_text(XLA)
    os.chown(path, OTHER_UID, OTHER_UID + 1)
    path.chmod(0o640)
    assert cli("rewrite", str(path)).returncode == 0  # written, nothing left to do
    st = path.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (OTHER_UID, OTHER_UID + 1, 0o640)
    assert path.read_text() == XLA_REWRITTEN


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    from tpu_migrate.rewrite import files

    path = tmp_path / "a.py"
    path.write_text(XLA)

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        files.write_atomic(str(path), b"new")
    assert path.read_text() == XLA
    assert [p.name for p in tmp_path.iterdir()] == ["a.py"]


def test_a_file_edited_during_the_run_is_not_overwritten(tmp_path):
    from tpu_migrate.rewrite.files import ChangedOnDisk, write_atomic

    path = tmp_path / "a.py"
    path.write_text("edited by someone else\n")
    with pytest.raises(ChangedOnDisk):
        write_atomic(str(path), XLA_REWRITTEN.encode(), expected=XLA.encode())
    assert path.read_text() == "edited by someone else\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.py"]


def test_a_file_with_a_name_of_255_bytes_can_be_written(tmp_path):
    from tpu_migrate.rewrite.files import write_atomic

    path = tmp_path / ("é" * 125 + "_a.py")  # 255 bytes in UTF-8
    path.write_text(XLA)
    write_atomic(str(path), XLA_REWRITTEN.encode(), expected=XLA.encode())
    assert path.read_text() == XLA_REWRITTEN
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def _children_cpu_seconds(parent: int) -> dict[int, float]:
    """CPU seconds used so far by each child of `parent` (from /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat_line = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat_line[stat_line.rfind(b")") + 2 :].split()
        if int(fields[1]) == parent:
            found[int(entry)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_file_whose_worker_always_dies_is_named_and_the_others_are_rewritten(tmp_path):
    """What the OOM killer does to a worker that rewrites a huge file, done with SIGKILL: any
    worker that has used 1.5 s of CPU is killed (the small files take a few ms each). The run
    ends normally, names the file in one error line, leaves it unchanged, and rewrites the rest."""
    for i in range(30):
        (tmp_path / f"small_{i}.py").write_text(XLA)
    huge = tmp_path / "huge.py"
    huge.write_text("import torch_xla.core.xla_model as xm\n" + "".join(
        f"def f{i}(t):\n    xm.mark_step()\n    return t + {i}\n\n" for i in range(8000)))
    original = huge.read_bytes()
    process = subprocess.Popen(
        [sys.executable, "-m", "tpu_migrate", "rewrite", "--jobs", "2", "--max-file-size", "0", "--no-cache",
         str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    killed = 0
    deadline = time.monotonic() + 240
    while process.poll() is None and time.monotonic() < deadline:
        for pid, seconds in _children_cpu_seconds(process.pid).items():
            if seconds > 1.5:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
        time.sleep(0.05)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 2, err.decode()
    assert killed >= 2  # the worker in the pool, then the process of its own
    errors = [line for line in err.decode().splitlines() if ": error: " in line]
    assert errors == [f"{huge}: error: the process rewriting it died (killed by SIGKILL: out of memory, "
                      "or a crash); the file is unchanged"]
    assert huge.read_bytes() == original
    assert all((tmp_path / f"small_{i}.py").read_text() == XLA_REWRITTEN for i in range(30))


def _die_on_poison(task: tuple) -> FileResult:
    """A worker that dies (SIGKILL) on the files named poison*."""
    if task[0].startswith("poison"):
        os.kill(os.getpid(), signal.SIGKILL)
    return FileResult(task[0])


def test_worker_deaths_cost_only_the_files_that_cause_them():
    tasks = [(f"file{i}",) for i in range(200)]
    for i in (0, 7, 8, 150, 199):
        tasks[i] = (f"poison{i}",)
    results = list(run_tasks(_die_on_poison, tasks, jobs=2))
    assert [r.path for r in results] == [t[0] for t in tasks]  # every file, in order
    assert [r.path for r in results if r.error] == ["poison0", "poison7", "poison8", "poison150", "poison199"]
    assert all("killed by SIGKILL" in r.error for r in results if r.error)


def test_workers_end_with_a_killed_parent(tmp_path):
    """SIGKILL (or the OOM killer) gives the tool no chance to stop its pool: its workers must
    notice and end, not finish their files for nobody and then wait forever on the task queue."""
    import process_groups

    function = ("\n\ndef train_{n}(opt, loader, device):\n    for x in pl.MpDeviceLoader(loader, device):\n"
                "        xm.optimizer_step(opt)\n        xm.master_print(xr.global_ordinal())\n")
    header = ("import torch_xla.core.xla_model as xm\nimport torch_xla.distributed.parallel_loader as pl\n"
              "import torch_xla.runtime as xr\n")
    for index in range(4):  # several seconds of work each
        (tmp_path / f"big_{index}.py").write_text(header + "".join(function.format(n=n) for n in range(1500)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TPU_MIGRATE_CACHE_DIR": str(tmp_path / "cache")}
    tool = subprocess.Popen([sys.executable, "-m", "tpu_migrate", "rewrite", "--check", "--jobs", "2",
                             "--max-file-size", "0", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline and tool.poll() is None:
            time.sleep(0.2)
            workers = [pid for pid in process_groups.group_members(tool.pid) if pid != tool.pid]
        assert len(workers) >= 2, "the pool's workers never started"
        time.sleep(1.0)  # inside their first files
        tool.kill()
        tool.wait()
        deadline = time.monotonic() + 10
        # (A worker whose parent died is reaped by init: gone, not a zombie.)
        while time.monotonic() < deadline and any(process_groups.alive(pid) for pid in workers):
            time.sleep(0.1)
        assert not [pid for pid in workers if process_groups.alive(pid)], "workers outlived their killed parent"
    finally:
        process_groups.kill_group(tool)


def test_a_file_with_hard_links_is_refused_not_split(cli, tmp_path):
    """A new file under one name would leave the other names with the old text."""
    path, other = tmp_path / "a.py", tmp_path / "b.py"
    path.write_text(XLA)
    os.link(path, other)
    result = cli("rewrite", str(path))
    assert result.returncode == 2
    assert f"{path}: error: cannot write: it has 2 hard links" in result.stderr.decode()
    assert path.read_text() == other.read_text() == XLA and path.stat().st_ino == other.stat().st_ino


def test_extended_attributes_are_kept(cli, tmp_path):
    path = tmp_path / "a.py"
    path.write_text(XLA)
    os.setxattr(path, "user.origin", b"vendored")
    assert cli("rewrite", str(path)).returncode == 0
    assert path.read_text() == XLA_REWRITTEN
    assert os.getxattr(path, "user.origin") == b"vendored"


def test_a_path_swapped_for_a_link_just_before_the_rename_is_not_written(tmp_path, monkeypatch):
    """The file is replaced by a link to a file outside the tree with the same bytes (so the
    content check passes) after the new text is on disk: the rename must not land outside."""
    from tpu_migrate.rewrite import files

    path, outside = tmp_path / "tree" / "a.py", tmp_path / "outside.py"
    path.parent.mkdir()
    path.write_text(XLA)
    outside.write_text(XLA)
    real_fsync = os.fsync

    def swap_then_sync(fd):
        real_fsync(fd)
        path.rename(path.with_suffix(".moved"))
        path.symlink_to(outside)

    monkeypatch.setattr(files.os, "fsync", swap_then_sync)
    with pytest.raises(files.ChangedOnDisk, match="the path was replaced"):
        files.write_atomic(str(path), XLA_REWRITTEN.encode(), expected=XLA.encode())
    assert outside.read_text() == XLA and path.with_suffix(".moved").read_text() == XLA
    assert not [p for p in path.parent.iterdir() if p.name.endswith(files.TEMP_SUFFIX)]


def test_a_file_swapped_for_a_link_after_it_was_read_is_not_written(tmp_path):
    """Between the read and the write the file is replaced by a link to a file outside the tree
    with the same bytes: the write would land outside. It lands nowhere."""
    from tpu_migrate.rewrite import files
    from tpu_migrate.rewrite.context import Options
    from tpu_migrate.rewrite.paths import rewrite_path

    path, outside = tmp_path / "tree" / "a.py", tmp_path / "outside.py"
    path.parent.mkdir()
    path.write_text(XLA)
    outside.write_text(XLA)
    result = rewrite_path(str(path), Options())
    assert result.changed and result.inode == path.stat().st_ino
    path.unlink()
    path.symlink_to(outside)
    with pytest.raises(files.ChangedOnDisk, match="another file than the one read"):
        files.write_atomic(str(path), result.output, expected=result.original, inode=result.inode)
    assert outside.read_text() == XLA
