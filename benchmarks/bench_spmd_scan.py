"""What the project pass for SPMD programs (rewrite/spmd_programs.py) adds to a run.

    python benchmarks/bench_spmd_scan.py                # 2,000 files, 1 SPMD program
    python benchmarks/bench_spmd_scan.py --files 10000
    python benchmarks/bench_spmd_scan.py --tree DIR    # both project passes over a real tree

Every run reads the project's Python files for SPMD markers, also a run that the result cache
answers, such as pre-commit's on one changed file. This builds a synthetic project (a git
root), then measures side by side, best of --repeat: the pass alone, in this process, and a
whole `tpu-migrate rewrite --check ONE_FILE` answered from the cache, as a fresh process. It
prints both and their ratio: the share of such a run the pass takes.

The synthetic files are small and mostly unrelated. `--tree DIR` times the two project passes
(spmd_programs.py, parameter_flows.py) over a real tree taken as the project root instead:
transformers' installed package (2,951 files; one file names SPMD, and 2,900 files import it,
directly or not) took more than 2 minutes before each file's imports were found once and the
first program of each module read off the import graph (issue 52). The three passes run over
one reading of the project (rewrite/project.py), as the CLI runs them; their time is printed
against libcst's parse+print of the tree's Python files, measured in the same process, the
floor bench_rewrite.py measures the rewrite against (`--tree fixtures/corpus` from the
checkout: the in-place run, whose project is the whole repository). `--code DIR` imports the
tool from another checkout (main's, say) to compare in one session.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if "--code" in sys.argv:  # the tool of another checkout, imported before anything of it
    ROOT = Path(sys.argv[sys.argv.index("--code") + 1]).resolve()
sys.path.insert(0, str(ROOT))

from tpu_migrate.rewrite.spmd_programs import spmd_modules  # noqa: E402

PLAIN = "import os\n\n\ndef f{n}(x):\n    return os.path.join(str(x), '{n}')\n" * 8
XLA = "import torch_xla.runtime as xr\n\n\ndef rank{n}():\n    return xr.global_ordinal()\n"
PROGRAM = "import torch_xla.runtime as xr\n{imports}\nxr.use_spmd()\n"


def build(root: Path, files: int) -> Path:
    (root / ".git").mkdir()
    package = root / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for n in range(files):
        text = XLA if n % 20 == 0 else PLAIN
        (package / f"m{n}.py").write_text(text.format(n=n))
    imports = "\n".join(f"from pkg import m{n}" for n in range(0, min(files, 400), 20))
    (root / "train.py").write_text(PROGRAM.format(imports=imports))
    return package / "m20.py"


def best(repeat: int, run) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def project_passes(tree: Path) -> dict[str, tuple]:
    """The three project passes over `tree`, as `rewrite` runs them on it (its project root)."""
    from tpu_migrate import cli
    from tpu_migrate.rewrite.files import discover

    files = [path for path, error in discover([str(tree)]) if error is None]
    if hasattr(cli, "_project_passes"):
        return cli._project_passes([str(tree)], files)
    return {"spmd_modules": cli._spmd_modules([str(tree)], files),  # a checkout from before rewrite/project.py
            "xla_parameters": cli._xla_parameters([str(tree)], files),
            "kept_launches": cli._kept_launches([str(tree)], files)}


def time_tree(tree: Path, repeat: int) -> None:
    """The project passes over a real tree against libcst's parse+print of the run's Python
    files (those `rewrite TREE` rewrites: the floor of the run the passes are part of),
    alternated, best of `repeat` each."""
    import libcst as cst

    from tpu_migrate.config import project_root
    from tpu_migrate.rewrite.files import discover

    root = project_root([str(tree)])
    files = [Path(path) for path, error in discover([str(tree)]) if error is None and path.endswith(".py")]

    def floor() -> None:
        for path in files:
            cst.parse_module(path.read_bytes()).code

    def timed(run) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        return time.perf_counter() - wall, time.process_time() - cpu

    found = project_passes(tree)
    spent, floor_spent = [], []
    for _ in range(repeat):
        spent.append(timed(lambda: project_passes(tree)))
        floor_spent.append(timed(floor))
    print(f"tool from {ROOT}; project root {root}; the run rewrites {len(files)} Python files")
    print("found: " + ", ".join(f"{name} {len(value)}" for name, value in found.items()))
    for kind, index in (("wall", 0), ("CPU", 1)):
        passes, libcst = min(t[index] for t in spent), min(t[index] for t in floor_spent)
        print(f"{kind:4} project passes {passes:7.3f} s, libcst parse+print of the run's files {libcst:7.3f} s, "
              f"ratio {passes / libcst:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tree", type=Path, help="time the project passes over this tree, as the CLI reads it")
    parser.add_argument("--code", type=Path, help="import the tool from this checkout instead")
    args = parser.parse_args()
    if args.tree is not None:
        time_tree(args.tree, args.repeat)
        return
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        target = build(root, args.files)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TPU_MIGRATE_CACHE_DIR": str(root / ".cache")}
        command = [sys.executable, "-m", "tpu_migrate", "rewrite", "--check", str(target)]
        subprocess.run(command, env=env, cwd=root, capture_output=True)  # fills the cache
        found = spmd_modules([], root)
        assert os.path.realpath(target) in dict(found), "the program's module was not found"
        scan = best(args.repeat, lambda: spmd_modules([], root))
        cached = best(args.repeat, lambda: subprocess.run(command, env=env, cwd=root, capture_output=True))
    print(f"{args.files} files, {len(found)} imported by the SPMD program")
    print(f"the pass alone:                 {scan * 1000:7.1f} ms")
    print(f"a cached run of one file (CLI): {cached * 1000:7.1f} ms")
    print(f"ratio pass / cached run:        {scan / cached:7.2f}")


if __name__ == "__main__":
    main()
