"""TPU173's helper picks the modules torch_xla's FSDP would have wrapped, in the same order.

torch_xla's `XlaFullyShardedDataParallel(model, auto_wrap_policy=p)` ran its `recursive_wrap`
over the children of `model` (the root is never asked) and wrapped, innermost first, each
module the policy picked; the migrated code calls `fully_shard` on those modules, then on the
model, with torch's copy of the policy (TPU175). Which modules are wrapped changes no number
(fixtures/programs/multiprocess/m16 cannot tell), so it is checked here: the helper as the
rewrite writes it (both targets), `fully_shard` and the mesh replaced by recorders, against
torch_xla 2.9's own `recursive_wrap` and policies with a recording wrapper. torch_xla runs in a
process of its own (importing it here would load its runtime into the test process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fixture_spec import TARGETS, rewrite

pytestmark = pytest.mark.slow  # torch_xla in a subprocess

SOURCE = b"""from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP


def wrap(model, policy):
    return FSDP(model, auto_wrap_policy=policy)
"""

POLICIES = ("always", "lambda", "none", "size-100", "size-600", "size-huge", "size-leaves", "transformer")

COMPARE = r'''
import functools, json, os, sys
import torch
import torch.distributed.fsdp.wrap as torch_wrap
import torch_xla.distributed.fsdp.wrap as xla_wrap
from torch import nn


class Block(nn.Module):
    def __init__(self, width, inner=False):
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)
        self.inner = Block(width) if inner else None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(12, 16)
        self.blocks = nn.Sequential(Block(16), Block(16, inner=True), Block(16))
        self.layers = nn.ModuleList([nn.Linear(16, 16), Block(16)])
        self.attention = nn.MultiheadAttention(16, 2)
        self.shared = self.embed  # one module under two names
        self.head = nn.Linear(16, 3)


def policies(library):
    """The same policies, from torch_xla's module or torch's."""
    return {
        "none": None,
        "transformer": functools.partial(library.transformer_auto_wrap_policy, transformer_layer_cls={Block}),
        "size-600": functools.partial(library.size_based_auto_wrap_policy, min_num_params=600),
        "size-100": functools.partial(library.size_based_auto_wrap_policy, min_num_params=100),
        "size-huge": functools.partial(library.size_based_auto_wrap_policy, min_num_params=10**9),
        "size-leaves": functools.partial(library.size_based_auto_wrap_policy, min_num_params=100,
                                         force_leaf_modules={Block}, exclude_wrap_modules={nn.Sequential}),
        "always": library.always_wrap_policy,
        "lambda": functools.partial(library.lambda_auto_wrap_policy,
                                    lambda_fn=lambda m: isinstance(m, (nn.Linear, nn.ModuleList))),
    }


def names(model, ids):
    by_id = {}
    for name, module in model.named_modules():
        by_id.setdefault(id(module), name or "<root>")
    return [by_id[i] for i in ids]


def torch_xla_wrapped(model, policy):
    """The modules torch_xla's FSDP wraps, in order (the root last)."""
    wrapped = []

    def record(module, **kwargs):
        wrapped.append(id(module))
        return module

    if policy is not None:
        xla_wrap.recursive_wrap(model, auto_wrap_policy=policy, wrapper_cls=record, ignored_modules=set(),
                                ignored_params=set(), only_wrap_children=True)
    return names(model, [*wrapped, id(model)])


class Dist:
    """The process-group calls the helper makes, for a group that already exists."""
    is_initialized = staticmethod(lambda: True)
    get_world_size = staticmethod(lambda: 1)


def migrated_wrapped(model, policy, helper):
    wrapped = []

    def fully_shard(module, mesh=None, **options):
        assert mesh == "mesh"
        wrapped.append(id(module))
        return module

    torch.distributed.fsdp.fully_shard = fully_shard
    torch.distributed.device_mesh.init_device_mesh = lambda *args, **kwargs: "mesh"
    namespace = {"dist": Dist, "torch": torch, "os": os}
    exec(helper, namespace)
    assert namespace["_fully_shard"](model, auto_wrap_policy=policy) is model
    return names(model, wrapped)


helpers = json.load(sys.stdin)
import torch.distributed.device_mesh, torch.distributed.fsdp  # noqa: E401 (patched above)
results = {}
for name in policies(xla_wrap):
    torch.manual_seed(0)
    model = Net()
    results[name] = {"torch_xla": torch_xla_wrapped(model, policies(xla_wrap)[name])}
    for target, helper in helpers.items():
        results[name][target] = migrated_wrapped(model, policies(torch_wrap)[name], helper)
print(json.dumps(results))
'''


def helper_source(target: str) -> str:
    """The helpers the rewrite wrote into the file: `_join_world` and `_fully_shard`."""
    output = rewrite(SOURCE, target).output.decode()
    start = output.index("def _join_world(")
    return output[start:output.index("\ndef wrap(", start)]


@pytest.fixture(scope="module")
def wrapped() -> dict:
    helpers = json.dumps({target: helper_source(target) for target in TARGETS})
    run = subprocess.run([sys.executable, "-c", COMPARE], input=helpers, capture_output=True, text=True,
                         env={**os.environ, "PJRT_DEVICE": "CPU"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("policy", POLICIES)
def test_the_helper_wraps_what_torch_xla_wrapped(wrapped, policy, target):
    expected = wrapped[policy]["torch_xla"]
    assert wrapped[policy][target] == expected
    assert expected[-1] == "<root>" and expected.count("<root>") == 1
    if policy not in ("none", "size-huge"):
        assert len(expected) > 2, f"{policy} should pick some modules besides the root: {expected}"


def test_every_policy_is_compared(wrapped):
    assert sorted(wrapped) == sorted(POLICIES)


def test_the_file_is_asked_once_whether_a_wrap_passes_a_policy(monkeypatch):
    """Each wrap's helper asked it of the whole file again: a walk of the file per wrap."""
    from tpu_migrate.rewrite.transforms import fsdp

    walks = []
    passes = fsdp.passes_wrap_policy
    monkeypatch.setattr(fsdp, "passes_wrap_policy", lambda analysis: walks.append(analysis) or passes(analysis))
    source = SOURCE + b"".join(b"\n\ndef wrap%d(model):\n    return FSDP(model)\n" % i for i in range(4))
    for target in TARGETS:
        assert b"_fully_shard" in rewrite(source, target).output
    assert len(walks) == len(TARGETS), walks
