"""A dense corpus for bench_rewrite.py: every Python file that mentions torch_xla in real public
repositories, taken from their git history at a fixed commit (nothing third-party is committed here).

    python benchmarks/dense_corpus.py OUT GITDIR[@REV] [GITDIR[@REV] ...]
    python benchmarks/bench_rewrite.py --corpus OUT --cli

A git directory can be a clone's `.git` or a bare mirror (the `fetch` tool's /work/.mirror/owner+name/repo).
The measurements in issue 16's closing note used pytorch/xla @ 41398bff (294 files) with
huggingface/optimum-tpu, huggingface/accelerate, pytorch/ignite and Lightning-AI/pytorch-lightning
at the mirrors' heads: 386 files, 113,656 lines, all of them torch_xla code.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={gitdir}", *args], check=True, capture_output=True).stdout


def extract(gitdir: str, rev: str, out: Path) -> int:
    """Write each `*.py` file at `rev` that mentions torch_xla under `out`; return how many."""
    listing = git(gitdir, "grep", "-l", "-e", "torch_xla", rev, "--", "*.py").decode()
    count = 0
    for line in listing.splitlines():
        path = line.split(":", 1)[1]
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(git(gitdir, "show", f"{rev}:{path}"))
        count += 1
    return count


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    for spec in argv[1:]:
        gitdir, _, rev = spec.partition("@")
        rev = rev or git(gitdir, "rev-parse", "HEAD").decode().strip()
        name = Path(gitdir).parent.name if Path(gitdir).name in ("repo", ".git") else Path(gitdir).name
        print(f"{name} @ {rev[:8]}: {extract(gitdir, rev, out / name)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
