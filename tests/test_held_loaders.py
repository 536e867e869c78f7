"""The code TPU040 and TPU041 write for a device loader held outside a loop, run for real: the
migrated module is executed and its loader compared with what torch_xla's classes gave.

The CPU differential run (fixtures/programs/p14_held_device_loader.py) cannot see a move to the
device, since its device is the CPU; here the device is `meta`, so a batch left behind shows."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest

from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes

SOURCE = b'''
import torch_xla.distributed.parallel_loader as pl
import torch_xla.utils.utils as xu


def make_loader(loader, device):
    return pl.MpDeviceLoader(loader, device, loader_prefetch_size=4)


def make_fake_data(data, count):
    return xu.SampleGenerator(data=data, sample_count=count)


def unpacked(loader, device):
    seen = []
    for images, labels, names in pl.MpDeviceLoader(loader, device):
        seen.append((images, labels, names))
    return seen


def consume(batches):
    return len(batches), list(batches)


def parallel_epochs(loader, device, epochs):
    """The 1.x loop: a ParallelLoader per epoch, its per-device loader passed on, then
    read again (the pass is used up)."""
    seen = []
    for epoch in range(epochs):
        para_loader = pl.ParallelLoader(loader, [device], loader_prefetch_size=2)
        seen.append(consume(para_loader.per_device_loader(device)))
        seen.append(consume(para_loader.per_device_loader(device)))
    return seen
'''

Pair = collections.namedtuple("Pair", "x y")


class Encoding(collections.UserDict):
    """What transformers' BatchEncoding is (a UserDict with attributes of its own): torch_xla's
    loaders went through its attributes to its tensors."""


@pytest.fixture
def torch():
    """torch, imported by the tests that use it: collecting the suite (every xdist worker does)
    should not pay for importing it."""
    import torch

    return torch


@pytest.fixture
def batches(torch):
    return [
        (torch.ones(2), torch.zeros(2)),
        [torch.ones(3), 7],
        {"input": torch.ones(1), "nested": {"mask": torch.zeros(1)}, "name": "b3"},
        Pair(torch.ones(1), torch.ones(1)),
        Encoding({"input_ids": torch.ones(2, dtype=torch.long), "note": "b5"}),
    ]


def migrated(target: str) -> dict:
    result = rewrite_bytes(SOURCE, "held.py", Options(target=target))
    assert result.error is None and result.changed
    assert b"torch_xla" not in result.output
    namespace: dict = {}
    exec(compile(result.output, "held.py", "exec"), namespace)
    return namespace


def on_meta(value) -> bool:
    """Every tensor in `value` (however nested) is on the meta device."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.device.type == "meta"
    if isinstance(value, dict):
        return all(on_meta(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(on_meta(v) for v in value)
    if isinstance(value, collections.UserDict):
        return on_meta(value.data)
    return True


@pytest.mark.parametrize("target", ["tpu", "portable"])
def test_the_held_loader_moves_every_batch_on_every_pass(target, torch, batches):
    loader = migrated(target)["make_loader"](batches, torch.device("meta"))
    assert len(loader) == len(batches)
    for _ in range(2):  # a second epoch sees every batch again
        seen = list(loader)
        assert len(seen) == len(batches)
        assert all(on_meta(batch) for batch in seen)
    first, second, third, fourth, fifth = seen
    assert isinstance(first, tuple) and isinstance(second, list) and second[1] == 7
    assert set(third) == {"input", "nested", "name"} and third["name"] == "b3"
    assert isinstance(fourth, Pair)
    assert isinstance(fifth, Encoding) and fifth["note"] == "b5"
    assert loader._loader is batches  # read by code around MpDeviceLoader (Lightning)
    assert all(t.device.type == "cpu" for t in batches[0])  # the CPU batches are not changed


@pytest.mark.parametrize("target", ["tpu", "portable"])
def test_an_unpacked_batch_moves_its_tensors_and_keeps_the_rest(target, torch):
    """`for images, labels, names in MpDeviceLoader(...)`: torch_xla moved the tensors and passed
    the file names through (a review of real notebooks found `.to()` called on each part)."""
    batches = [(torch.ones(2, 3), torch.zeros(2), ("a.jpg", "b.jpg")),
               (torch.ones(2, 3), [{"box": torch.ones(4)}], ("c.jpg", "d.jpg"))]
    seen = migrated(target)["unpacked"](batches, torch.device("meta"))
    assert [names for _, _, names in seen] == [("a.jpg", "b.jpg"), ("c.jpg", "d.jpg")]
    assert all(on_meta(images) and on_meta(labels) for images, labels, _ in seen)


@pytest.mark.parametrize("target", ["tpu", "portable"])
def test_a_parallel_loader_passed_on_is_one_pass_of_moved_batches(target, torch, batches):
    """ParallelLoader began one pass over the loader when made; its per_device_loader iterated
    that pass (len() the loader's), and a second per_device_loader found it used up."""
    seen = migrated(target)["parallel_epochs"](batches, torch.device("meta"), 2)
    assert [(length, len(got)) for length, got in seen] == [(5, 5), (5, 0)] * 2
    assert all(on_meta(batch) for _, got in seen for batch in got)
    assert seen[0][1][2]["name"] == "b3" and isinstance(seen[0][1][3], Pair)


@pytest.mark.parametrize("target", ["tpu", "portable"])
def test_fake_data_is_the_same_object_count_times_on_every_pass(target, torch):
    data = (torch.zeros(2), torch.ones(2))
    fake = migrated(target)["make_fake_data"](data, 3)
    assert len(fake) == 3
    for _ in range(2):
        assert [item is data for item in fake] == [True, True, True]


COMPARE_WITH_TORCH_XLA = """
import sys, torch
import torch_xla.utils.utils as xu
namespace = {}
exec(sys.stdin.read(), namespace)
data = {"x": torch.zeros(1)}
original = xu.SampleGenerator(data=data, sample_count=4)
fake = namespace["make_fake_data"](data, 4)
assert len(fake) == len(original) == 4
for _ in range(2):
    assert [id(item) for item in fake] == [id(item) for item in original] == [id(data)] * 4
print("same")
"""


@pytest.mark.slow  # runs torch_xla's SampleGenerator in a subprocess
def test_fake_data_matches_torch_xla_sample_generator():
    """torch_xla's own SampleGenerator, in a process of its own (importing torch_xla here would
    load its runtime into the test process)."""
    result = rewrite_bytes(SOURCE, "held.py", Options(target="portable"))
    run = subprocess.run([sys.executable, "-c", COMPARE_WITH_TORCH_XLA], input=result.output,
                         capture_output=True, env={**os.environ, "PJRT_DEVICE": "CPU"}, timeout=300)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert run.stdout.strip() == b"same"
