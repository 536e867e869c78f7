"""How fast is `tpu-migrate rewrite` compared with a plain libcst parse+print of the same files?

    python benchmarks/bench_rewrite.py                 # builds a synthetic corpus
    python benchmarks/bench_rewrite.py --corpus DIR    # or measures a real tree
    python benchmarks/bench_rewrite.py --files 400 --repeat 5
    python benchmarks/bench_rewrite.py --corpus DIR --cli   # a cold CLI run, as a user runs it

Both sides run in this process, one file at a time (the tool with --jobs 1 semantics), reading
every file from disk, and the best of --repeat runs is kept: these machines are noisy, and the
ratio of two numbers measured side by side is what means something. Two ratios are printed:

- all files: what a user sees on a repository (files without torch_xla are pre-filtered);
- torch_xla files only: the files the tool must parse and rewrite, against libcst's parse+print
  of those same files: the engine's own overhead.

With --cli, a third: `tpu-migrate rewrite --check --jobs 1 --no-cache DIR` as a fresh process
(start-up, discovery and the report included), against libcst's parse+print of every file; and
against the same parse+print as a fresh process too (Python's start-up and libcst's import, about
0.15 s, included on both sides): the "cold floor" line.
A dense corpus of real torch_xla code: benchmarks/dense_corpus.py.

The tool runs with the garbage collector mostly idle (gc_settings.fewer_collections), which a bare
parse+print does not do; so the floor is measured both ways, and both ratios printed: against
parse+print as it comes, and against parse+print with the same collector settings. The runs
alternate (tool, floor, floor with those settings) and the best of each is kept.

Each table is printed twice: wall time, and CPU time (this process's, or the CLI process's),
which moves less on a shared machine. `--code DIR` runs the tool of another checkout (main's,
say: its package is imported, and its CLI run from DIR), to compare two versions in one session.
"""

from __future__ import annotations

import argparse
import compileall
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent
if "--code" in sys.argv:  # the tool of another checkout, imported before anything of it
    ROOT = Path(sys.argv[sys.argv.index("--code") + 1]).resolve()
sys.path.insert(0, str(ROOT))

from tpu_migrate.rewrite.context import Options  # noqa: E402
from tpu_migrate.rewrite.paths import fewer_collections, rewrite_paths  # noqa: E402
from tpu_migrate.rewrite.files import discover  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import build_corpus  # noqa: E402


def timed(run) -> tuple[float, float]:
    """(wall, CPU of this process) seconds `run()` took."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def time_tool(paths: list[str]) -> tuple[float, float]:
    def run():
        for result in rewrite_paths(paths, Options(), jobs=1):
            assert result.error is None, (result.path, result.error)
    return timed(run)


def time_parse_print(paths: list[str]) -> tuple[float, float]:
    def run():
        for path in paths:
            with open(path, "rb") as handle:
                data = handle.read()
            cst.parse_module(data).code
    return timed(run)


def time_parse_print_same_gc(paths: list[str]) -> tuple[float, float]:
    with fewer_collections():
        return time_parse_print(paths)


def alternating(runs, repeat: int) -> list[tuple[float, float]]:
    """The best (wall, CPU) of each of `runs` (callables), run in turn `repeat` times."""
    times = [[] for _ in runs]
    for _ in range(repeat):
        for spent, run in zip(times, runs):
            spent.append(run())
    return [(min(wall for wall, _ in spent), min(cpu for _, cpu in spent)) for spent in times]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_cli(root: Path) -> tuple[float, float]:
    """(wall, CPU of the CLI process) of a cold run."""
    start, cpu = time.perf_counter(), _children_cpu()
    run = subprocess.run([sys.executable, "-m", "tpu_migrate", "rewrite", "--check", "--jobs", "1",
                          "--no-cache", str(root)], capture_output=True, cwd=ROOT)
    if run.returncode not in (0, 1):  # 1: files would change
        raise SystemExit(f"tpu-migrate failed ({run.returncode}): {run.stderr.decode()[-2000:]}")
    return time.perf_counter() - start, _children_cpu() - cpu


_COLD_FLOOR = """
import sys, libcst
for path in open(sys.argv[1]).read().splitlines():
    with open(path, "rb") as handle:
        libcst.parse_module(handle.read()).code
"""


def time_cold_floor(paths: list[str]) -> tuple[float, float]:
    """(wall, CPU of the process) of libcst's parse+print of `paths` in a fresh Python."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as listing:
        listing.write("\n".join(paths))
        listing.flush()
        start, cpu = time.perf_counter(), _children_cpu()
        subprocess.run([sys.executable, "-c", _COLD_FLOOR, listing.name], check=True)
        return time.perf_counter() - start, _children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, help="measure this tree instead of a synthetic one")
    parser.add_argument("--files", type=int, default=300, help="files in the synthetic corpus")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cli", action="store_true", help="also time a cold CLI run of the whole tree")
    parser.add_argument("--code", type=Path, help="run the tool of this checkout instead")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tpu-migrate-bench-") as tmp:
        root = args.corpus
        if root is None:
            root = Path(tmp)
            build_corpus(root, args.files)
        paths = [p for p, error in discover([str(root)]) if error is None]
        xla_paths = [p for p in paths if b"torch_xla" in Path(p).read_bytes()]
        lines = sum(Path(p).read_text(errors="replace").count("\n") for p in paths)
        time_tool(paths[:5])  # warm imports and caches on both sides
        time_parse_print(paths[:5])

        floors = (time_parse_print, time_parse_print_same_gc)
        rows = {}
        for label, subset in (("all files", paths), ("torch_xla files only", xla_paths)):
            rows[label] = alternating([lambda: time_tool(subset), *(lambda f=f: f(subset) for f in floors)],
                                      args.repeat)
        if args.cli:
            # Byte-compiled as an install leaves it (PYTHONDONTWRITEBYTECODE, set on some
            # machines, would have every cold run compile the tool's changed modules anew).
            compileall.compile_dir(ROOT / "tpu_migrate", quiet=1)
            *cli_times, cold_floor = alternating(
                [lambda: time_cli(root), *(lambda f=f: f(paths) for f in floors), lambda: time_cold_floor(paths)],
                args.repeat)
            rows["cold CLI, --jobs 1"] = cli_times

    print(f"tool from {ROOT}; corpus: {len(paths)} files, {lines} lines, {len(xla_paths)} mention torch_xla")
    for kind, index in (("wall", 0), ("CPU", 1)):
        print(f"{kind:24}{'tpu-migrate':>12}{'parse+print':>13}{'ratio':>7}{'same GC':>10}{'ratio':>7}")
        for label, times in rows.items():
            tool, floor, floor_gc = (spent[index] for spent in times)
            print(f"{label:24}{tool:>11.3f}s{floor:>12.3f}s{tool / floor:>7.2f}{floor_gc:>9.3f}s{tool / floor_gc:>7.2f}")
        if args.cli:
            tool, cold = rows["cold CLI, --jobs 1"][0][index], cold_floor[index]
            print(f"{'  against a cold floor':24}{tool:>11.3f}s{cold:>12.3f}s{tool / cold:>7.2f}")


if __name__ == "__main__":
    main()
