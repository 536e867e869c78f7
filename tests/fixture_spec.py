"""What a rewrite fixture case specifies, shared by `tests/test_fixtures.py` and
`fixtures/rewrite/regenerate.py`.

A case `fixtures/rewrite/<dir>/<case>.in.py` has beside it the output per target
(`<case>.tpu.py`, `<case>.portable.py`) and the findings of both targets (`<case>.findings.txt`,
one line per finding: `<target> <line>:<col> <code> fixed` or `... <code> manual: <message>`,
and `<target> <line> note: <message>`). A case named `leave_alone*` in a rule's directory holds
near misses of that rule (code that looks like its target but is not): none of its findings may
carry the rule's code, and each line ending in `# near miss` must be in both outputs unchanged.
"""

from __future__ import annotations

from pathlib import Path

from tpu_migrate.findings import FileResult

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "rewrite"
TARGETS = ("tpu", "portable")
LEAVE_ALONE = "leave_alone"
NEAR_MISS = "# near miss"


def rewrite_cases() -> list[Path]:
    return sorted(FIXTURES.glob("*/*.in.py"))


def expected_path(case: Path, target: str) -> Path:
    return case.with_name(case.name.replace(".in.py", f".{target}.py"))


def findings_path(case: Path) -> Path:
    return case.with_name(case.name.replace(".in.py", ".findings.txt"))


def rule_code(case: Path) -> str | None:
    """The code of the rule whose directory holds the case (`TPU010`), None for `engine/`."""
    code = case.parent.name.split("-")[0]
    return code if code.startswith("TPU") else None


def is_leave_alone(case: Path) -> bool:
    return case.name.startswith(LEAVE_ALONE)


def near_miss_lines(case: Path) -> list[str]:
    return [line for line in case.read_text().splitlines() if line.endswith(NEAR_MISS)]


def rewrite(data: bytes, target: str, name: str = "case.py") -> FileResult:
    # Imported here: conftest imports this module, and most tests never rewrite (~1 s of imports).
    from tpu_migrate.rewrite.context import Options
    from tpu_migrate.rewrite.engine import rewrite_bytes

    result = rewrite_bytes(data, name, Options(target=target))
    if result.error is not None:
        raise AssertionError(f"{name} ({target}): {result.error}")
    return result


def output(result: FileResult, data: bytes) -> bytes:
    return result.output if result.changed else data


def codes(result: FileResult) -> set[str]:
    return {f.code for f in result.fixes} | {m.code for m in result.manual}


def findings_text(results: dict[str, FileResult]) -> str:
    """The findings file of one case from its result per target, in `TARGETS` order."""
    lines = []
    for target in TARGETS:
        result = results[target]
        entries = [((f.line, f.col, f.code), f"{f.line}:{f.col} {f.code} fixed") for f in result.fixes]
        entries += [((m.line, m.col, m.code), f"{m.line}:{m.col} {m.code} manual: {_one_line(m.message)}")
                    for m in result.manual]
        lines += [f"{target} {text}" for _, text in sorted(entries)]
        lines += [f"{target} {n.line} note: {_one_line(n.message)}" for n in result.notes]
    return "".join(line + "\n" for line in lines)


def _one_line(message: str) -> str:
    return message.replace("\\", "\\\\").replace("\n", "\\n")
