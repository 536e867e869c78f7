"""rewrite/printing.py: libcst prints the same text with the do-nothing context managers swapped
out, positions from libcst's metadata are the same, and libcst's own methods come back after;
a rewritten module prints the same with its unchanged statements copied from the parsed text
(rewrite/source_spans.py), and libcst prints only the others."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import MetadataWrapper, PositionProvider

from tpu_migrate.findings import FileResult
from tpu_migrate.rewrite import engine, printing
from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.except_colons import restore_except_colons
from tpu_migrate.rewrite.source_spans import source_spans
from tpu_migrate.rules import load_catalog

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
    assert cst.IndentedBlock._codegen_impl is printing._INDENTED_BLOCK


class _Rename(cst.CSTTransformer):
    def leave_Name(self, original, updated):
        return updated.with_changes(value=updated.value + "_") if updated.value in ("a", "c") else updated


class _Recording(CodegenState):
    """libcst's printing, noting each statement's text as printed in its place."""

    def before_codegen(self, node):
        if isinstance(node, cst.BaseStatement):
            self.starts.append(len(self.tokens))

    def after_codegen(self, node):
        if isinstance(node, cst.BaseStatement):
            self.texts[id(node)] = "".join(self.tokens[self.starts.pop():])


def _printed_statements(module: cst.Module) -> dict[int, str]:
    state = _Recording(default_indent=module.default_indent, default_newline=module.default_newline)
    state.starts, state.texts = [], {}
    module._codegen(state)
    return state.texts


_TRICKY = '''\
# header comment

import os  # why


# above f
@decorator
# between decorators
@other(
    1,
)
def f(a,
      b):
    """doc"""
    x = 1; y = 2
    if a:
        pass
        # deeper footer of the if
    elif b: return 3
    else:
        s = """
text"""
    # footer of f
# above the class
class A(Base):
    def m(self):
        try:
            pass
        except (E) :
            pass
        except F:
            pass
        else:
            pass
        finally:
            y = (
                2)
    for i in x:
        pass
    else:
        pass
    with a as b, c:
        while 1: break
match x:
    case 1:
        pass
    case _:
        pass
        # last case's footer
# the module's footer
'''


def test_each_statements_span_is_the_text_libcst_prints_for_it():
    sources = [_TRICKY, *(path.read_text(encoding="utf-8")  # a third of them: the test stays cheap
                          for path in sorted((ROOT / "fixtures" / "corpus").glob("*.py"))[::3])]
    checked = 0
    for text in sources:
        tree = ast.parse(text)
        module = restore_except_colons(cst.parse_module(text), text, tree)  # as the engine does
        spans = source_spans(module, tree, text, None)
        assert spans is not None
        printed = _printed_statements(module)
        for key, (start, own_start, end) in spans.spans.items():
            assert printed[key] == text[start:end]
            assert text[own_start:end].lstrip(" \t")[:1] not in "#\r\n"  # its own first line
            checked += 1
    assert checked > 300


def test_no_spans_where_the_numbers_do_not_check_out():
    for text in ["@(\n    decorator)\ndef f():\n    pass\n",  # ast's decorator line is not the `@`'s
                 "if x:\n    y = 1 \\\n\nz = 2\n",  # a backslash continues the block's last line
                 "x = 1\n\n  # a\n\n  # b\n",  # libcst loses lines of this end (engine._true_footer)
                 "x = 1",  # no line break at the end
                 "class A:\n\x0c    pass\n"]:
        module = cst.parse_module(text)
        assert source_spans(module, ast.parse(text), text, None) is None, text


_ONE_CHANGE = '''\
import torch_xla.core.xla_model as xm


def helper(values):
    total = 0
    for value in values:
        total += value
    return total


def train(model, loader):
    # the steps
    model.train()
    for step, batch in enumerate(loader):
        loss = model(batch)
        loss.backward()
    device = xm.xla_device()
    model.to(device)
    return model
'''


def test_only_the_changed_statements_go_through_libcsts_printer(monkeypatch):
    """One changed line in a function: libcst prints that line and the added import, and the
    function's other statements and the rest of the file are copied (without copying, libcst
    printed 14)."""
    printed, seen = [], []
    module_code = printing.module_code

    def counting(module, spans, counts=None, checked=None):
        code = module_code(module, spans, printed, checked)
        assert code == module.code
        seen.append(checked[-1])
        return code

    monkeypatch.setattr(printing, "module_code", counting)
    result = FileResult("train.py")
    with printing.quick_printing():
        output = engine.rewrite_text(_ONE_CHANGE, "train.py", Options(), load_catalog(), result, whole=True)
    assert 'device = torch.device("tpu")' in output and "xla_model" not in output
    assert printed and printed[-1] <= 3, printed
    # The output's parse check reads what libcst printed, and the headers around it.
    assert seen[-1] == 'import torch\n\n\ndef train(model, loader):\n    device = torch.device("tpu")\n'


def test_the_parse_check_text_keeps_a_statement_in_each_block_it_empties():
    """A block whose statements are all copied whole keeps a `pass` at their indentation: the
    checked text parses exactly when the printed text does (engine._check_parses)."""
    source = "import torch_xla.core.xla_model as xm\n\nif xm.xla_device():\n    x = 1\n    y = 2\nelse:\n    z = 3\n"
    module = cst.parse_module(source)
    tree = ast.parse(source)
    test = module.body[1].test
    new_if = module.body[1].with_changes(test=test.with_changes(func=cst.Name("device")))
    new_module = module.with_changes(body=[module.body[0], new_if])
    checked = []
    with printing.quick_printing():
        code = printing.module_code(new_module, source_spans(module, tree, source, None), checked=checked)
    assert code == new_module.code
    assert checked == ["\nif device():\n    pass\nelse:\n    pass\n"]
