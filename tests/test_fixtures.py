"""Golden fixtures: every rule, both targets, compared byte for byte (outputs and findings), each
output a fixed point, each rule's directory exercising that rule and holding a near miss of it.

Each case is rewritten once per target (cached): the assertions below share the results."""

from __future__ import annotations

import ast
import difflib
import functools
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import ROOT, undefined_names
from fixture_spec import (
    FIXTURES, NEAR_MISS, TARGETS, codes, expected_path, findings_path, findings_text, is_leave_alone,
    near_miss_lines, output, rewrite, rewrite_cases, rule_code,
)
from test_realistic import unmarked_references
from tpu_migrate.rewrite.todos import open_todos
from tpu_migrate.rules import load_catalog

CASES = rewrite_cases()
CASE_IDS = [f"{case.parent.name}/{case.name[:-6]}" for case in CASES]


@functools.cache
def rewritten(case: Path, target: str):
    return rewrite(case.read_bytes(), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fixture_output_matches(case, target):
    expected = expected_path(case, target).read_bytes()
    assert output(rewritten(case, target), case.read_bytes()).decode() == expected.decode()


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fixture_findings_match(case):
    expected = findings_path(case).read_text()
    assert findings_text({target: rewritten(case, target) for target in TARGETS}) == expected


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fixture_output_is_a_fixed_point(case, target):
    """A second run changes nothing and reports the first run's manual work word for word (a
    rule whose message depended on the helpers the first run added worded it otherwise, and
    wrote a second TODO: issue 49)."""
    expected = expected_path(case, target).read_bytes()
    again = rewrite(expected, target)
    assert output(again, expected) == expected
    ast.parse(expected)
    assert _manual_work(again) == _manual_work(rewritten(case, target))


def _manual_work(result) -> Counter:
    return Counter((m.code, " ".join(m.message.split())) for m in result.manual)


@functools.cache
def checked_with_tpu(case: Path):
    """The case's portable output rewritten again with the tpu target: a tree migrated with
    `--target portable`, then checked with the default target."""
    return rewrite(expected_path(case, "portable").read_bytes(), "tpu")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_a_portable_output_checked_with_the_tpu_target_holds_the_tpu_target_s_todos(case):
    """A tree migrated with --target portable and checked again with the tpu target (issue 49).

    It holds the TODOs of a fresh tpu run of the original, rule for rule at the matching
    statements, and no other. The portable TODOs stand for the tpu target's findings of the
    same rules on the same statements, so none is added and none is reported twice; and they
    say what a fresh tpu run's say (TPU130's advice on a backend chosen at run time: "use
    "tpu"", not the portable "leave the backend out"), but where the portable words hold on
    TorchTPU too (_PORTABLE_WORDING_STAYS). Where the portable target left torch_xla code with a TODO that the tpu
    target converts (TPU150: "device memory statistics have no CPU equivalent"), the TODO goes
    with the code and the work is no longer reported: the output is a fresh tpu run's. The
    tpu-only work that the portable output no longer shows as torch_xla's is marked again, in
    the plain PyTorch code the portable target wrote: a collective it ported running on a gloo
    group or a library's groups (TPU100, TPU101), the backend of a group made from a variable
    (TPU070), torch.compile's inductor on the accelerator's tensors (TPU130). Other outputs may
    differ from the tpu output in code, for a reason: the portable target's conversions are
    plain PyTorch (`torch.accelerator.current_accelerator(...) or torch.device("cpu")`) that the
    tpu target leaves as it is. Not in work: no finding of a rule beyond the fresh tpu run's."""
    portable = expected_path(case, "portable").read_bytes()
    tpu = expected_path(case, "tpu").read_text()
    result = checked_with_tpu(case)
    again = output(result, portable).decode()
    converted = _converted_todos(portable.decode(), result)
    todos_before = Counter(m.code for m in open_todos(portable.decode()))
    assert _unmatched_todos(tpu, again) == ([], [])
    assert _todo_texts(again) == _todo_texts(tpu)
    # Reported once: as the comment, or as the tpu target's finding it stands for, not both;
    # and not at all where the run converted what the comment marked.
    fresh = rewritten(case, "tpu")
    own = Counter(m.code for m in fresh.manual)
    reported = Counter(m.code for m in result.manual)
    assert all(reported[code] <= max(count, own[code]) for code, count in todos_before.items()), result.manual
    assert [t for t in converted if (t.line, t.code) in {(m.line, m.code) for m in result.manual}] == []
    if converted:
        assert again == tpu
    elif not result.fixes:  # only TODOs added: the code is the portable target's
        assert _without_todos(again) == _without_todos(portable.decode())
    assert reported - own == Counter()


# The rules whose portable TODOs stay as the portable target worded them on a re-check: their
# advice holds on TorchTPU too (TPU004: compare with the accelerator's device type and
# dist.get_backend()).
_PORTABLE_WORDING_STAYS = {"TPU004"}


def _todo_texts(text: str) -> Counter:
    """The file's TODOs as a fresh run words them, with the lines they name left out (each
    file's own)."""
    return Counter((todo.code, re.sub(r"\(line \d+\)", "(line N)", " ".join(todo.message.split())))
                   for todo in open_todos(text) if todo.code not in _PORTABLE_WORDING_STAYS)


def _without_todos(text: str) -> list[str]:
    todo_lines = {todo.line for todo in open_todos(text)}
    return [line for number, line in enumerate(text.splitlines(), 1) if number not in todo_lines]


def _todo_places(text: str) -> tuple[list[str], list[tuple[str, int]]]:
    """The file's lines without its TODO(tpu-migrate) comments, and (code, index there of the
    first line of the statement below it) per TODO."""
    lines = text.splitlines()
    todo_lines = {todo.line for todo in open_todos(text)}
    kept, index_of = [], {}
    for number, line in enumerate(lines, 1):
        if number not in todo_lines:
            index_of[number] = len(kept)
            kept.append(line.strip())
    places = []
    for todo in open_todos(text):
        number = todo.line + 1
        while number <= len(lines) and (not lines[number - 1].strip() or lines[number - 1].lstrip().startswith("#")):
            number += 1
        places.append((todo.code, index_of.get(number, len(kept))))
    return kept, places


def _unmatched_todos(fresh: str, again: str) -> tuple[list, list]:
    """The TODOs of `fresh` with none of the same rule at the matching statement of `again`, and
    those of `again` left over. Statements match through a diff of the two files' lines: a line
    both hold, or one of the lines that stand in its place (the targets write some code
    differently: `torch.device("tpu")`, `torch.accelerator...`)."""
    fresh_lines, fresh_places = _todo_places(fresh)
    again_lines, again_places = _todo_places(again)
    opcodes = difflib.SequenceMatcher(None, fresh_lines, again_lines, autojunk=False).get_opcodes()

    def matching(index: int) -> range:
        for tag, i1, i2, j1, j2 in opcodes:
            if i1 <= index < i2:
                return range(j1 + index - i1, j1 + index - i1 + 1) if tag == "equal" else range(j1, max(j2, j1 + 1))
        return range(len(again_lines), len(again_lines) + 1)

    left = list(again_places)
    missing = []
    for code, index in fresh_places:
        place = next((p for p in left if p[0] == code and p[1] in matching(index)), None)
        if place is None:
            missing.append((code, fresh_lines[index] if index < len(fresh_lines) else ""))
        else:
            left.remove(place)
    return missing, [(code, again_lines[index] if index < len(again_lines) else "") for code, index in left]


def _converted_todos(text: str, result) -> list:
    """The TODO comments of `text` (an input) directly above a statement (comments between, no
    blank line) where `result` fixed that rule and reported no finding of it: work the run did."""
    lines = text.splitlines()
    spans = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.stmt):
            body = getattr(node, "body", None)
            end = body[0].lineno - 1 if isinstance(body, list) and body else node.end_lineno
            spans[node.lineno] = max(node.lineno, end)
    converted = []
    for todo in open_todos(text):
        start = todo.line + 1
        while start <= len(lines) and lines[start - 1].lstrip().startswith("#"):
            start += 1
        end = spans.get(start)
        if end is None:
            continue
        inside = [f for f in [*result.fixes, *result.manual] if start <= f.line <= end and f.code == todo.code]
        if inside and all(f in result.fixes for f in inside):
            converted.append(todo)
    return converted


def test_every_rule_has_fixtures_for_both_targets():
    directories = {p.name.split("-")[0] for p in FIXTURES.iterdir() if p.is_dir()}
    for rule in load_catalog().rules:
        assert rule.code in directories, f"{rule.code} has no fixture directory"
        cases = list(FIXTURES.glob(f"{rule.code}-*/*.in.py"))
        assert cases, rule.code
        for case in cases:
            for target in TARGETS:
                assert expected_path(case, target).is_file()
            assert findings_path(case).is_file()


@pytest.mark.parametrize("target", TARGETS)
def test_every_rule_directory_exercises_its_rule(target):
    """Some case of a rule's directory reports that rule: its outputs are the rule's work, not
    only the work of the other rules its cases also trigger."""
    for rule in load_catalog().rules:
        cases = FIXTURES.glob(f"{rule.code}-*/*.in.py")
        assert any(rule.code in codes(rewritten(case, target)) for case in cases), rule.code


def test_every_rule_has_a_leave_alone_case():
    for rule in load_catalog().rules:
        cases = [case for case in FIXTURES.glob(f"{rule.code}-*/*.in.py") if is_leave_alone(case)]
        assert cases, f"{rule.code} has no leave_alone*.in.py case (a near miss it must not report)"


LEAVE_ALONE = [case for case in CASES if is_leave_alone(case)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", LEAVE_ALONE, ids=[f"{c.parent.name}/{c.name[:-6]}" for c in LEAVE_ALONE])
def test_leave_alone_case_is_not_reported(case, target):
    """A near miss of its directory's rule: no finding of that rule, and each line marked
    `# near miss` is in the output as it was (the rest of the file may be other rules' work)."""
    result = rewritten(case, target)
    assert rule_code(case) not in codes(result)
    near_misses = near_miss_lines(case)
    assert near_misses, f"{case.name} marks no line `{NEAR_MISS}`"
    kept = set(output(result, case.read_bytes()).decode().splitlines())
    assert [line for line in near_misses if line not in kept] == []


def test_findings_of_a_case_name_no_rule_outside_the_catalog():
    known = {rule.code for rule in load_catalog().rules}
    for case in CASES:
        for target in TARGETS:
            assert codes(rewritten(case, target)) <= known, case


@functools.cache
def _undefined_names(path: Path) -> frozenset[str]:
    return frozenset(undefined_names(path.read_bytes()))


@pytest.mark.parametrize("target", TARGETS)
def test_outputs_use_no_undefined_names(target):
    for case in CASES:
        introduced = _undefined_names(expected_path(case, target)) - _undefined_names(case)
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


@pytest.mark.parametrize("target", TARGETS)
def test_every_remaining_reference_is_marked(target):
    """Each torch_xla / optimum.tpu name an output still uses sits in a statement with a TODO
    above it or a suppression comment (tests/test_realistic.py's check, on every case)."""
    unmarked = {f"{case.parent.name}/{case.name}": problems for case in CASES
                if (problems := unmarked_references(expected_path(case, target).read_text()))}
    assert unmarked == {}


def test_tpu_target_never_emits_raising_or_indexed_device_calls():
    forbidden = ("torch.tpu.is_available", "torch.tpu.device_count", "torch.tpu.current_device",
                 "torch.tpu.set_device", "torch.tpu.synchronize", '"tpu:', "'tpu:", "api.tpu_device")
    for case in CASES:
        text = expected_path(case, "tpu").read_text()
        for needle in forbidden:
            assert needle not in text, f"{case.name}: {needle}"


@pytest.mark.slow
def test_regenerate_takes_one_rule_and_this_checkout_s_code(tmp_path):
    """`regenerate.py TPU021` rewrites that rule's cases only, with this checkout's tpu_migrate
    even where another is first on the path (here one that cannot be imported); an unknown
    selection is an error. The cases come out as they are committed (the fixtures are current)."""
    shadow = tmp_path / "shadow" / "tpu_migrate"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the installed tpu_migrate, not this checkout')\n")
    cases = sorted((ROOT / "fixtures" / "rewrite").glob("TPU021-*/*"))
    before = {path: path.read_bytes() for path in cases}
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow")}
    script = ROOT / "fixtures" / "rewrite" / "regenerate.py"
    done = subprocess.run([sys.executable, str(script), "TPU021"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == sorted(str(p.relative_to(ROOT / "fixtures" / "rewrite"))
                                         for p in cases if p.name.endswith(".in.py"))
    assert {path: path.read_bytes() for path in cases} == before
    unknown = subprocess.run([sys.executable, str(script), "TPU999"], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=300)
    assert unknown.returncode == 2 and "no fixture case for TPU999" in unknown.stderr
