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
(start-up, discovery and the report included), against libcst's parse+print of every file,
the two alternating. A dense corpus of real torch_xla code: benchmarks/dense_corpus.py.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpu_migrate.rewrite.context import Options  # noqa: E402
from tpu_migrate.rewrite.paths import rewrite_path  # noqa: E402
from tpu_migrate.rewrite.files import discover  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from corpus import build_corpus  # noqa: E402


def time_tool(paths: list[str]) -> float:
    options = Options()
    start = time.perf_counter()
    for path in paths:
        result = rewrite_path(path, options)
        assert result.error is None, (path, result.error)
    return time.perf_counter() - start


def time_parse_print(paths: list[str]) -> float:
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb") as handle:
            data = handle.read()
        cst.parse_module(data).code
    return time.perf_counter() - start


def best(fn, paths: list[str], repeat: int) -> float:
    return min(fn(paths) for _ in range(repeat))


def time_cli(root: Path) -> float:
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "tpu_migrate", "rewrite", "--check", "--jobs", "1",
                          "--no-cache", str(root)], capture_output=True, cwd=ROOT)
    if run.returncode not in (0, 1):  # 1: files would change
        raise SystemExit(f"tpu-migrate failed ({run.returncode}): {run.stderr.decode()[-2000:]}")
    return time.perf_counter() - start


def cli_against_floor(root: Path, paths: list[str], repeat: int) -> tuple[float, float]:
    """Best of `repeat` alternating runs of each: the cold CLI, and parse+print in this process."""
    cli, floor = [], []
    for _ in range(repeat):
        cli.append(time_cli(root))
        floor.append(time_parse_print(paths))
    return min(cli), min(floor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, help="measure this tree instead of a synthetic one")
    parser.add_argument("--files", type=int, default=300, help="files in the synthetic corpus")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cli", action="store_true", help="also time a cold CLI run of the whole tree")
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

        tool_all = best(time_tool, paths, args.repeat)
        base_all = best(time_parse_print, paths, args.repeat)
        tool_xla = best(time_tool, xla_paths, args.repeat)
        base_xla = best(time_parse_print, xla_paths, args.repeat)
        if args.cli:
            cli, floor = cli_against_floor(root, paths, args.repeat)

    print(f"corpus: {len(paths)} files, {lines} lines, {len(xla_paths)} mention torch_xla")
    print(f"{'':28}{'tpu-migrate':>14}{'parse+print':>14}{'ratio':>8}")
    print(f"{'all files':28}{tool_all:>13.3f}s{base_all:>13.3f}s{tool_all / base_all:>8.2f}")
    print(f"{'torch_xla files only':28}{tool_xla:>13.3f}s{base_xla:>13.3f}s{tool_xla / base_xla:>8.2f}")
    if args.cli:
        print(f"{'cold CLI, --jobs 1':28}{cli:>13.3f}s{floor:>13.3f}s{cli / floor:>8.2f}")


if __name__ == "__main__":
    main()
