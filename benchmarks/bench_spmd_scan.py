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
first program of each module read off the import graph (issue 52).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tree", type=Path, help="time the project passes over this tree (its root)")
    args = parser.parse_args()
    if args.tree is not None:
        from tpu_migrate.rewrite.parameter_flows import project_parameters

        for name, project_pass in (("SPMD programs", spmd_modules), ("parameters to torch_xla", project_parameters)):
            found = project_pass([], args.tree)
            spent = best(args.repeat, lambda: project_pass([], args.tree))
            print(f"{name:24} {spent:8.2f} s  ({len(found)} modules found)")
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
