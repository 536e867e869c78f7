"""The literal-only evaluator behind folding tests a conversion made constant
(tpu_migrate/rewrite/constant_tests.py): it answers only what cannot run the program's code."""

from __future__ import annotations

import pytest

from tpu_migrate.rewrite.constant_tests import constant_truth


@pytest.mark.parametrize(("test", "truth"), [
    ('"TPU" in ("TPU", "NEURON")', True),
    ('"TPU" == "TPU" or "TPU" == "TPU"', True),
    ('not "TPU" == "GPU"', True),
    ('"TPU" != "TPU" and True', False),
    ('len([torch.device("tpu")]) > 1', False),
    ('1 < len((torch.device("tpu"), torch.device("tpu"))) <= 2', True),
    ('"TPU" in {"TPU"}', True),
])
def test_literal_tests_have_a_value(test, truth):
    assert constant_truth(test) is truth


@pytest.mark.parametrize("test", [
    'device == "TPU"', '"TPU" in kinds', 'len(devices) > 1', 'len([make()]) > 1',
    'len([torch.device(kind)]) > 1', 'f("TPU") == "TPU"', '-1', '"TPU" in', '"a" < 1',
])
def test_anything_that_names_or_calls_the_program_s_code_has_none(test):
    assert constant_truth(test) is None
