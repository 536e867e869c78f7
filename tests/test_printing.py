"""rewrite/printing.py: libcst prints the same text with the do-nothing context managers swapped
out, positions from libcst's metadata are the same, and libcst's own methods come back after."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import MetadataWrapper, PositionProvider

from tpu_migrate.rewrite import printing

ROOT = Path(__file__).resolve().parent.parent


def _positions(module: cst.Module) -> list:
    return sorted((p.start.line, p.start.column, p.end.line, p.end.column)
                  for p in MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider).values())


def test_quick_printing_prints_the_same_text_and_positions_and_puts_libcst_back():
    record = CodegenState.record_syntactic_position
    paths = sorted((ROOT / "fixtures" / "corpus").glob("*.py"))[:3]
    modules = [cst.parse_module(path.read_text(encoding="utf-8")) for path in paths]
    # parentheses, nested and around every kind of expression; a changed node inside them
    modules.append(cst.parse_module("x = ((a) + (b))[(c)]\nf((yield), *(d), **(e))\n").visit(_Rename()))
    plain = [(m.code, [m.code_for_node(s) for s in m.body], _positions(m)) for m in modules]
    with printing.quick_printing():
        assert CodegenState.record_syntactic_position is printing._record_nothing
        with printing.quick_printing():  # nested (a notebook's cells): still swapped after
            pass
        assert CodegenState.record_syntactic_position is printing._record_nothing
        quick = [(m.code, [m.code_for_node(s) for s in m.body], _positions(m)) for m in modules]
    assert quick == plain
    assert CodegenState.record_syntactic_position is record


class _Rename(cst.CSTTransformer):
    def leave_Name(self, original, updated):
        return updated.with_changes(value=updated.value + "_") if updated.value in ("a", "c") else updated
