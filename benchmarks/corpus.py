"""Synthetic corpora for the benchmarks: plain PyTorch model code, with torch_xla idioms taken
from the repository's own fixtures (the rule cases, the realistic files, the quick-start example).

- `build_corpus`: a small repository (bench_rewrite.py): ~20% training scripts, ~15% helpers.
- `build_monorepo`: a large tree (bench_scale.py): nested packages, files of very different sizes
  (an `__init__.py` of a few lines up to modules of a few thousand), about 2% of the files using
  torch_xla, about 1% mentioning XLA without torch_xla (JAX code, comments), so the pre-filter
  lets them through to the parser.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

TRAIN = (FIXTURES / "examples" / "train_mnist_xla.py").read_text()

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

CONFIG = '''

@dataclasses.dataclass
class {name}Config:
    """Settings for {name}; loaded from YAML by the launcher."""

    learning_rate: float = {lr}
    batch_size: int = {batch}
    warmup_steps: int = 500
    weight_decay: float = 0.01
    gradient_clip: float | None = 1.0
    data_dirs: tuple[str, ...] = ("gs://bucket/train", "gs://bucket/eval")

    def scaled(self, world_size: int) -> "{name}Config":
        return dataclasses.replace(self, learning_rate=self.learning_rate * world_size ** 0.5)
'''

TEST = '''

def test_{name}_shapes():
    layer = nn.Linear({dim}, {dim})
    x = torch.randn(4, {dim})
    out = layer(x)
    assert out.shape == (4, {dim}), out.shape
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_{name}_dtypes(dtype):
    x = torch.ones(2, {dim}, dtype=dtype)
    assert (x.sum(dim=-1) == {dim}).all()
'''

# Files that pass the byte pre-filter without using torch_xla: JAX code, a comment.
NEAR_MISS = (
    '"""Runs the same model under JAX for comparison."""\nimport jax\nfrom jax.lib import xla_bridge\n\n\n'
    'def backend():\n    return xla_bridge.get_backend().platform\n',
    '# Tuned on TPU v4; see XLA_FLAGS in the launcher for the compiler settings.\n',
)

HEADERS = (
    '"""Model code."""\nimport torch\nimport torch.nn as nn\n',
    '"""Configuration objects."""\nimport dataclasses\n\nimport torch\nimport torch.nn as nn\n',
    '"""Unit tests."""\nimport pytest\nimport torch\nimport torch.nn as nn\n',
)


def plain_body(rng: random.Random, blocks: int, kinds: str = "fc") -> str:
    """`blocks` blocks of ordinary PyTorch code: f(unction), c(lass), g (config), t(est)."""
    parts = []
    for i in range(blocks):
        kind = rng.choice(kinds)
        if kind == "f":
            parts.append(PLAIN_FUNCTION.format(name=f"block_{i}", scale=rng.random(), loops=rng.randint(1, 4)))
        elif kind == "c":
            parts.append(PLAIN_CLASS.format(name=f"Layer{i}", dim=64 * rng.randint(1, 8), heads=rng.choice([2, 4, 8])))
        elif kind == "g":
            parts.append(CONFIG.format(name=f"Block{i}", lr=rng.choice([1e-4, 3e-4, 1e-3]), batch=rng.choice([8, 32, 128])))
        else:
            parts.append(TEST.format(name=f"block_{i}", dim=8 * rng.randint(1, 16)))
    return "".join(parts)


def build_corpus(directory: Path, files: int, seed: int = 0) -> None:
    """A repository-shaped tree: ~20% training scripts, ~15% helpers, the rest plain torch."""
    rng = random.Random(seed)
    header = HEADERS[0]
    for i in range(files):
        package = directory / f"pkg{i % 10}"
        package.mkdir(parents=True, exist_ok=True)
        roll = rng.random()
        if roll < 0.20:
            text = TRAIN + plain_body(rng, rng.randint(2, 8))
        elif roll < 0.35:
            text = HELPER + "import torch.nn as nn\n" + plain_body(rng, rng.randint(4, 12))
        else:
            text = header + plain_body(rng, rng.randint(4, 14))
        (package / f"module_{i}.py").write_text(text)


@lru_cache(maxsize=None)
def xla_sources() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(whole files to start a torch_xla module with, snippets that can follow other code).

    The rule fixtures' inputs, the realistic files, the quick-start example and a helper module;
    only those that parse (a snippet must not start with `from __future__`).
    """
    anchors, snippets = [TRAIN, HELPER], [HELPER]
    paths = sorted((FIXTURES / "rewrite").glob("TPU*/*.in.py")) + sorted((FIXTURES / "realistic").glob("*.py"))
    for path in paths:
        text = path.read_text(encoding="utf-8")
        try:
            ast.parse(text)
        except SyntaxError:
            continue
        anchors.append(text)
        if "__future__" not in text:
            snippets.append(text)
    return tuple(anchors), tuple(snippets)


@dataclass
class MonorepoStats:
    files: int = 0
    lines: int = 0
    bytes: int = 0
    xla_files: int = 0
    near_miss_files: int = 0


def build_monorepo(directory: Path, files: int, seed: int = 0, xla_share: float = 0.02,
                   near_miss_share: float = 0.01) -> MonorepoStats:
    """A large repository: top-level areas, nested packages of ~25 files, about 200 lines a file.

    Sizes are skewed as in real trees: a tenth of the files are tiny `__init__.py`-like modules,
    most have 4 to 20 blocks of code (50 to 300 lines), a few are over a thousand lines long.
    """
    rng = random.Random(seed)
    anchors, snippets = xla_sources()
    stats = MonorepoStats()
    areas = ("services", "libs", "research", "tools", "platform")
    order = list(range(files))
    rng.shuffle(order)
    xla = set(order[:round(files * xla_share)])
    near_miss = set(order[len(xla):len(xla) + round(files * near_miss_share)])
    package: Path | None = None
    for i in range(files):
        if package is None or i % 25 == 0:
            parts = [rng.choice(areas)] + [f"{rng.choice(('core', 'data', 'models', 'train', 'eval', 'utils'))}_{rng.randint(0, 99)}"
                                           for _ in range(rng.randint(1, 3))]
            package = directory.joinpath(*parts)
            while package.exists() and any(package.iterdir()):
                package = package / f"sub{rng.randint(0, 9999)}"
            package.mkdir(parents=True, exist_ok=True)
        size = rng.random()
        blocks = rng.randint(0, 1) if size < 0.10 else rng.randint(4, 20) if size < 0.97 else rng.randint(60, 150)
        if i in xla:
            text = rng.choice(anchors) + "\nimport torch.nn as nn\n" + plain_body(rng, blocks)
            if rng.random() < 0.5:
                text += "\n\n" + rng.choice(snippets)
            stats.xla_files += 1
        elif i in near_miss:
            text = rng.choice(NEAR_MISS) + HEADERS[0] + plain_body(rng, blocks)
            stats.near_miss_files += 1
        else:
            kind = rng.randrange(len(HEADERS))
            text = HEADERS[kind] + plain_body(rng, blocks, ("fc", "fcg", "t")[kind])
        name = "__init__.py" if i % 25 == 0 else f"module_{i}.py"
        data = text.encode("utf-8")
        (package / name).write_bytes(data)
        stats.files += 1
        stats.lines += data.count(b"\n")
        stats.bytes += len(data)
    return stats
