"""How fast is `tpu-migrate rewrite` compared with a plain libcst parse+print of the same files?

    python benchmarks/bench_rewrite.py                 # builds a synthetic corpus
    python benchmarks/bench_rewrite.py --corpus DIR    # or measures a real tree
    python benchmarks/bench_rewrite.py --files 400 --repeat 5

Both sides run in this process, one file at a time (the tool with --jobs 1 semantics), reading
every file from disk, and the best of --repeat runs is kept: these machines are noisy, and the
ratio of two numbers measured side by side is what means something. Two ratios are printed:

- all files: what a user sees on a repository (files without torch_xla are pre-filtered);
- torch_xla files only: the files the tool must parse and rewrite, against libcst's parse+print
  of those same files: the engine's own overhead.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpu_migrate.rewrite.context import Options  # noqa: E402
from tpu_migrate.rewrite.engine import rewrite_path  # noqa: E402
from tpu_migrate.rewrite.files import discover  # noqa: E402

TRAIN = (ROOT / "fixtures" / "examples" / "train_mnist_xla.py").read_text()

HELPER = '''"""Device helpers used across the project."""
import torch
import torch_xla.core.xla_model as xm


def get_device():
    return xm.xla_device()


def world():
    return xm.xrt_world_size(), xm.get_ordinal()


def barrier(tag):
    xm.rendezvous(tag)
'''

PLAIN_FUNCTION = '''

def {name}(x, weight, bias=None, *, scale={scale}):
    """Compute a {name} block: normalise, project, activate."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + 1e-5)
    y = y @ weight.t()
    if bias is not None:
        y = y + bias
    for _ in range({loops}):
        y = torch.relu(y) * scale  # keep activations bounded
    return {{"out": y, "stats": (mean, var), "name": "{name}"}}
'''

PLAIN_CLASS = '''

class {name}(nn.Module):
    def __init__(self, dim={dim}, heads={heads}):
        super().__init__()
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
        att = att.softmax(dim=-1)
        return self.proj(att @ v)
'''


def plain_body(rng: random.Random, blocks: int) -> str:
    parts = []
    for i in range(blocks):
        if rng.random() < 0.5:
            parts.append(PLAIN_FUNCTION.format(name=f"block_{i}", scale=rng.random(), loops=rng.randint(1, 4)))
        else:
            parts.append(PLAIN_CLASS.format(name=f"Layer{i}", dim=64 * rng.randint(1, 8), heads=rng.choice([2, 4, 8])))
    return "".join(parts)


def build_corpus(directory: Path, files: int, seed: int = 0) -> None:
    """A repository-shaped tree: ~20% training scripts, ~15% helpers, the rest plain torch."""
    rng = random.Random(seed)
    header = "import torch\nimport torch.nn as nn\n"
    for i in range(files):
        package = directory / f"pkg{i % 10}"
        package.mkdir(parents=True, exist_ok=True)
        roll = rng.random()
        if roll < 0.20:
            text = TRAIN + plain_body(rng, rng.randint(2, 8))
        elif roll < 0.35:
            text = HELPER + "import torch.nn as nn\n" + plain_body(rng, rng.randint(4, 12))
        else:
            text = '"""Model code."""\n' + header + plain_body(rng, rng.randint(4, 14))
        (package / f"module_{i}.py").write_text(text)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, help="measure this tree instead of a synthetic one")
    parser.add_argument("--files", type=int, default=300, help="files in the synthetic corpus")
    parser.add_argument("--repeat", type=int, default=3)
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

    print(f"corpus: {len(paths)} files, {lines} lines, {len(xla_paths)} mention torch_xla")
    print(f"{'':28}{'tpu-migrate':>14}{'parse+print':>14}{'ratio':>8}")
    print(f"{'all files':28}{tool_all:>13.3f}s{base_all:>13.3f}s{tool_all / base_all:>8.2f}")
    print(f"{'torch_xla files only':28}{tool_xla:>13.3f}s{base_xla:>13.3f}s{tool_xla / base_xla:>8.2f}")


if __name__ == "__main__":
    main()
