"""`diagnose`'s native backend, with the CPU standing in: which reads wait for the TPU
(read_places.py) and the tensors followed from where they are made (tensor_places.py), in
this process (no program run)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tpu_migrate.diagnose import placement, recording  # noqa: E402
from tpu_migrate.diagnose.read_places import ReadPlaces  # noqa: E402
from tpu_migrate.diagnose.tensor_places import TensorPlaces  # noqa: E402


def standing_in(places_anything: bool) -> ReadPlaces:
    places = ReadPlaces({"cpu"}, cpu_stands_in=True)
    places.program_places = places_anything  # what the program's source says
    return places


def test_a_scalar_index_counts_as_its_item_where_the_program_places_nothing():
    # A program that names no device runs wholly on it: `t.item()` counts, and so does
    # `table[t]`, which torch reads in C++ as `t.item()` (it counted no index read before).
    places, index = standing_in(False), torch.tensor(2)
    assert places.counts(index, 1) == placement.DEVICE
    assert places.scalar_index(index, 1) == placement.DEVICE
    assert places.scalar_index(torch.tensor(2.0), 1) is None  # a float index is no integer read


def test_a_followed_host_scalar_index_counts_no_more_than_its_item():
    places = standing_in(True)
    marks = places.tensor_places = TensorPlaces(torch, places)
    marks.install()
    try:
        index = torch.tensor(2)  # a factory without device=: a host tensor, whose reads wait for nothing
        assert marks.is_host(index)
        assert places.counts(index, 1) is None and places.scalar_index(index, 1) is None
    finally:
        marks.uninstall()
    assert torch._C._len_torch_function_stack() == 0
