"""`diagnose`'s native backend, with the CPU standing in: which reads wait for the TPU
(read_places.py) and the tensors followed from where they are made (tensor_places.py), in
this process (no program run)."""

from __future__ import annotations

import threading

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


def test_uninstall_from_another_thread_stops_following_on_the_installers():
    # Each thread has its own mode stack: the worker's uninstall searched its own (empty) one,
    # and the mode kept marking every tensor made on the installer's thread.
    marks = TensorPlaces(torch, standing_in(True))
    marks.install()
    try:
        assert marks.is_host(torch.zeros(2))
        worker = threading.Thread(target=marks.uninstall)
        worker.start()
        worker.join()
        assert not marks.on and torch.from_numpy is marks.unseen["from_numpy"]  # factories back
        assert not marks.is_host(torch.zeros(2))  # made after: not followed
        # The installer's next compiled call (or compile) takes it off its stack for good.
        assert marks.suspend()
        marks.resume()
        assert torch._C._len_torch_function_stack() == 0
    finally:
        while marks in _stack():
            marks._off_stack()


def _stack() -> list:
    C = torch._C
    modes = [C._pop_torch_function_stack() for _ in range(C._len_torch_function_stack())]
    for mode in reversed(modes):
        C._push_on_torch_function_stack(mode)
    return modes


def test_a_mark_dropped_meanwhile_is_forgotten_quietly():
    marks = TensorPlaces(torch, standing_in(True))
    tensor = torch.zeros(1)
    marks._mark(tensor, True)
    ref = marks.host[id(tensor)]

    class Racing(dict):
        """Another thread (an in-place op's unmarking) drops the entry between the weakref
        callback's look-up and its removal."""

        def get(self, key, default=None):
            found = super().get(key, default)
            self.pop(key, None)
            return found

    marks.host = Racing(marks.host)
    marks._forget(ref)  # raised KeyError (printed by the weakref machinery) before
    assert not marks.host


@pytest.mark.slow  # imports torch._dynamo (about 3 s)
def test_tensor_following_resumes_after_a_lazy_backward_whose_end_callbacks_failed(tmp_path):
    # Dynamo runs its compile-end callbacks in order; one registered before ours that raises
    # skipped ours, and the mode that stepped aside for the lazily compiled backward (and every
    # read wrapper) stayed out for the rest of the run.
    from torch._dynamo.callback import CallbackTrigger, callback_handler, on_compile_end

    from tpu_migrate.diagnose.native import NativeHooks

    def failing(args):
        raise RuntimeError("another end callback failed")

    on_compile_end(failing)
    hooks = NativeHooks(recording.Recorder(str(tmp_path)), warmup_steps=2, scan_sources=False)
    marks = hooks.places.tensor_places = hooks.timer.aside = TensorPlaces(torch, hooks.places)
    try:
        hooks.install()
        assert marks.on_this_stack()
        with pytest.raises(RuntimeError, match="another end callback"):
            with callback_handler.install_callbacks(CallbackTrigger.LAZY_BACKWARD, "0/0"):
                assert not marks.stacked  # aside while Dynamo compiles the backward
        assert marks.on_this_stack()  # back once it ended
        assert torch.Tensor.item is hooks.method_wrappers["item"]
    finally:
        callback_handler.remove_end_callback(failing)
        hooks.uninstall()
    assert torch._C._len_torch_function_stack() == 0
