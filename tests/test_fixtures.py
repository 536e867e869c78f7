"""Golden fixtures: every rule, both targets, compared byte for byte, and each a fixed point."""

from __future__ import annotations

import ast

import pytest

from conftest import FIXTURES, expected_path, rewrite_cases, undefined_names
from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes
from tpu_migrate.rules import load_catalog

CASES = rewrite_cases()
TARGETS = ("tpu", "portable")


def rewrite(data: bytes, target: str, name: str = "case.py"):
    result = rewrite_bytes(data, name, Options(target=target))
    assert result.error is None, result.error
    return result.output if result.changed else data


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name[:-6]}")
def test_fixture_output_matches(case, target):
    expected = expected_path(case, target).read_bytes()
    assert rewrite(case.read_bytes(), target).decode() == expected.decode()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name[:-6]}")
def test_fixture_output_is_a_fixed_point(case, target):
    expected = expected_path(case, target).read_bytes()
    assert rewrite(expected, target) == expected
    ast.parse(expected)


def test_every_rule_has_fixtures_for_both_targets():
    directories = {p.name.split("-")[0] for p in FIXTURES.iterdir() if p.is_dir()}
    for rule in load_catalog().rules:
        assert rule.code in directories, f"{rule.code} has no fixture directory"
        cases = list(FIXTURES.glob(f"{rule.code}-*/*.in.py"))
        assert cases, rule.code
        for case in cases:
            for target in TARGETS:
                assert expected_path(case, target).is_file()


@pytest.mark.parametrize("target", TARGETS)
def test_outputs_use_no_undefined_names(target):
    for case in CASES:
        introduced = undefined_names(expected_path(case, target).read_bytes()) - undefined_names(case.read_bytes())
        assert not introduced, f"{case.name} ({target}): {introduced}"


@pytest.mark.parametrize("target", TARGETS)
def test_torch_xla_kept_only_where_work_is_marked(target):
    """An output may still import torch_xla only because a reference to it remains, and every
    remaining reference is marked with a TODO or was suppressed by the user."""
    for case in CASES:
        text = expected_path(case, target).read_text()
        tree = ast.parse(text)
        imports_xla = any(
            (isinstance(n, ast.Import) and any(a.name.startswith("torch_xla") for a in n.names))
            or (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("torch_xla"))
            for n in ast.walk(tree)
        )
        if imports_xla:
            assert "TODO(tpu-migrate)" in text or "tpu-migrate: ignore" in text, case.name


def test_tpu_target_never_emits_raising_or_indexed_device_calls():
    forbidden = ("torch.tpu.is_available", "torch.tpu.device_count", "torch.tpu.current_device",
                 "torch.tpu.set_device", "torch.tpu.synchronize", '"tpu:', "'tpu:", "api.tpu_device")
    for case in CASES:
        text = expected_path(case, "tpu").read_text()
        for needle in forbidden:
            assert needle not in text, f"{case.name}: {needle}"
