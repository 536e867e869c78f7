"""libcst parses a skeleton: the definitions no rule can change stay out of its parse and
print (tpu_migrate/rewrite/skeleton.py). What it must hold: the output and the findings are
those of parsing the whole file, byte for byte."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT
from tpu_migrate.findings import FileResult
from tpu_migrate.rewrite import engine, skeleton
from tpu_migrate.rewrite.context import Options
from tpu_migrate.rules import load_catalog

CATALOG = load_catalog()

HELPER = '''def load_config(path):
    """Read the run's settings; nothing here concerns the accelerator."""
    with open(path) as handle:
        text = handle.read()
    settings = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in settings.items()}
'''

PROGRAM = f'''import torch_xla.core.xla_model as xm


def log(message):  # the file's first indented line: libcst reads its indentation unit here
    print(message)


{HELPER}

class Meter:
    """A running mean, with nothing of the accelerator in it either: it is left out as a whole."""

    def __init__(self):
        self.total = 0.0
        self.count = 0

    def add(self, value, count=1):
        self.total += value * count
        self.count += count
        return self.total / max(self.count, 1)


def train(loader, model, optimizer):
    for batch in loader:
        optimizer.zero_grad()
        model(batch).sum().backward()
        xm.optimizer_step(optimizer)
        xm.mark_step()


if __name__ == "__main__":
    train(load_config("run.cfg"), None, None)
'''


def rewrite(text: str, target: str = "tpu", whole: bool = False):
    result = FileResult("t.py")
    output = engine.rewrite_text(text, "t.py", Options(target=target), CATALOG, result, whole=whole)
    findings = ([(f.line, f.col, f.code) for f in result.fixes],
                [(m.line, m.col, m.code, m.message) for m in result.manual])
    return output, findings


@pytest.fixture
def built(monkeypatch):
    """The skeletons the engine builds (and whether each came back from restore)."""
    made: list[tuple[skeleton.Skeleton, list]] = []
    build, restore = skeleton.build, skeleton.Skeleton.restore

    def spy_build(*args, **kwargs):
        found = build(*args, **kwargs)
        if found is not None:
            made.append((found, []))
        return found

    def spy_restore(self, code, gone=frozenset()):
        restored = restore(self, code, gone)
        next(entry for s, entry in made if s is self).append(restored is not None)
        return restored

    monkeypatch.setattr(skeleton, "build", spy_build)
    monkeypatch.setattr(skeleton.Skeleton, "restore", spy_restore)
    return made


def kept_texts(made) -> list[str]:
    return [kept.text for found, _ in made for kept in found.kept]


def test_definitions_without_torch_xla_stay_out_of_the_parse(built):
    output, findings = rewrite(PROGRAM)
    assert (output, findings) == rewrite(PROGRAM, whole=True)
    assert "xm." not in output and "import torch_xla" not in output
    assert len(built) == 1 and built[0][1] == [True]
    kept = kept_texts(built)
    assert kept[0] == HELPER
    assert kept[1].startswith("class Meter:") and kept[1].rstrip().endswith("max(self.count, 1)")
    parsed = built[0][0].text
    assert "def load_config" not in parsed and "class Meter" not in parsed
    assert "def train" in parsed  # it holds torch_xla calls
    assert len(parsed) < len(PROGRAM) * 0.6


def test_what_keeps_its_own_text(built):
    body = "    " + "\n    ".join(f"value_{n} = {n} * {n} + {n}" for n in range(12)) + "\n    return value_0\n"
    source = (
        "import torch_xla.core.xla_model as xm\n"
        "import torch_xla.distributed.xla_multiprocessing as xmp\n\n"
        f"def first():\n{body}\n"  # holds the file's first indented line: libcst's indent unit
        f"def uses_xla():\n    device = xm.xla_device()\n{body}\n"  # a rule changes it
        f"def imports_xla():\n    import torch_xla.debug.metrics as met\n{body}\n"  # import removal looks in
        f"def _mp_fn(index):\n{body}\n"  # the spawned worker: the launch rewrite leaves it alone
        "def short():\n    return 1\n\n"  # not worth a placeholder
        f"def left_out():\n{body}\n"
        "if __name__ == '__main__':\n    xmp.spawn(_mp_fn, args=())\n"
    )
    output, findings = rewrite(source)
    assert (output, findings) == rewrite(source, whole=True)
    # The definitions the walk enters keep their header, the statements it changes and the
    # import it may remove; the bodies' other statements go as one run each.
    assert kept_texts(built) == [body, body, body, f"def _mp_fn(index):\n{body}", f"def left_out():\n{body}"]
    parsed = built[0][0].text
    assert "def first():\n    __tpu_migrate_kept_0__\n" in parsed
    assert "    device = xm.xla_device()\n    __tpu_migrate_kept_1__\n" in parsed
    assert "    import torch_xla.debug.metrics as met\n    __tpu_migrate_kept_2__\n" in parsed


def test_an_unusual_end_of_file_keeps_the_last_statement(built):
    body = "    " + "\n    ".join(f"value_{n} = {n}" for n in range(30)) + "\n"
    source = (f"import torch_xla.core.xla_model as xm\n\ndef first():\n{body}\ndevice = xm.xla_device()\n\n"
              f"class Last:\n    def method(self):\n    {body.replace(chr(10) + '    ', chr(10) + '        ')}\n")
    plain_end = rewrite(source)
    assert plain_end == rewrite(source, whole=True)
    assert any("def method" in text for text in kept_texts(built))
    built.clear()
    unusual = source + "\n  # an indented comment after a blank line: libcst loses lines here\n"
    assert rewrite(unusual) == rewrite(unusual, whole=True)
    assert not any("def method" in text for text in kept_texts(built))


def test_comments_after_a_definition_stay_where_libcst_puts_them(built):
    source = (
        f"import torch_xla.core.xla_model as xm\n\n\ndef train():\n    xm.mark_step()\n\n\n{HELPER}"
        "        # deeper: the body's footer\n\n    # at the body's indentation: still the body's\n"
        "  # shallower, after it: the next statement's\n# column 0: the next statement's\n"
        "xm.rendezvous('done')\n"
    )
    assert rewrite(source) == rewrite(source, whole=True)
    kept = kept_texts(built)
    assert kept == [HELPER + "        # deeper: the body's footer\n\n    # at the body's indentation: still the body's\n"]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_line_endings(built, newline):
    source = PROGRAM.replace("\n", newline)
    output, findings = rewrite(source)
    assert (output, findings) == rewrite(source, whole=True)
    assert built and output.count("\r\n") == (output.count("\n") if newline == "\r\n" else 0)


@pytest.mark.parametrize("change", [
    lambda text: text.replace("class Meter:", "class Meter:\x0c"),  # form feed
    lambda text: text.replace("\n", "\r\n", 3),  # mixed line endings
    lambda text: text.replace("import torch_xla", "# __tpu_migrate_kept_0__\nimport torch_xla"),
    lambda text: text.replace("        text = handle.read()", "        text = \\\n            handle.read()"),
])
def test_files_parsed_whole(built, change):
    """Form feeds and mixed line endings (libcst's round trip is checked on the whole file), the
    placeholder's own name, and line continuations in a definition (ignored: the helper only)."""
    source = change(PROGRAM)
    assert rewrite(source) == rewrite(source, whole=True)
    assert not any(text.startswith("def load_config") for text in kept_texts(built))


@pytest.mark.parametrize("header, gone", [
    ("with torch_xla.step():", "torch_xla.step()"),  # unwrapped: its body moves out one level
    ("if xm.xla_device_hw(device) in ('TPU', 'NEURON'):", "xla_device_hw"),  # constant: folded
])
def test_moved_statements_are_parsed_where_they_go(built, header, gone):
    """A rule moves a block that holds placeholders to another indentation: their text cannot
    go back verbatim, so libcst parses them there (Skeleton.statements), as a whole parse does;
    the other placeholders still come back (no second parse of the file)."""
    nested = "\n".join("    " + line if line else line for line in HELPER.splitlines()) + "\n"
    block = "".join("    " + line if line.strip() else line for line in
                    (nested + "    # after the helper\n" + "".join(f"    value_{n} = load_config('{n}')\n"
                                                              for n in range(12))).splitlines(True))
    source = (f"import torch_xla\nimport torch_xla.core.xla_model as xm\n\n\n{HELPER}\n\n"
              f"def train(loader, device):\n    {header}\n{block}        load_config(xm.xla_device())\n"
              "    return 1\n")
    output, findings = rewrite(source)
    assert (output, findings) == rewrite(source, whole=True)
    assert len(built) == 1 and built[0][1] == [True]  # restored: no whole parse
    kept = kept_texts(built)
    assert kept[0] == HELPER.split('"""\n', 1)[1]  # the helper's body: back verbatim
    assert kept[1].startswith("        def load_config(path):") and kept[1].endswith("value_11 = load_config('11')\n")
    assert gone not in output and nested in output and "    # after the helper\n    value_0 =" in output


def test_an_output_that_does_not_parse_is_reported_at_its_own_line(monkeypatch, built):
    """Fault injection (as in test_engine.py), below two left-out definitions: the error names
    the output's line, as a whole parse does, not the line in the shorter text libcst printed."""
    import libcst as cst

    from tpu_migrate.rewrite import transforms
    from tpu_migrate.rewrite.engine import rewrite_bytes

    def broken(call, qualname, sc, rule):
        sc.fixed(rule.code, qualname)
        return cst.Attribute(value=cst.Integer("1"), attr=cst.Name("real"))  # prints `1.real`

    monkeypatch.setitem(transforms.CALL, "device_call", broken)
    source = (PROGRAM + "device = xm.xla_device()\n").encode()
    result = rewrite_bytes(source, "t.py", Options())
    assert built and built[0][1] == [True]
    assert not result.changed and result.output is None
    monkeypatch.setattr(skeleton, "build", lambda *args, **kwargs: None)
    whole = rewrite_bytes(source, "t.py", Options())
    found = re.match(r"internal error: the rewritten file does not parse \(line (\d+)", whole.error)
    # The broken line is the last one of the input (lines are added above it, not removed).
    assert found and int(found.group(1)) >= source.count(b"\n"), whole.error
    assert result.error == whole.error


def test_restore_refuses_what_did_not_come_back_as_it_went_in():
    kept = skeleton.Skeleton("", [skeleton.Kept("    ", "    def f():\n        pass\n")])
    name = skeleton.PREFIX + "0__"
    assert kept.restore(f"class A:\n    {name}\n") == "class A:\n    def f():\n        pass\n"
    assert kept.restore(f"class A:\n        {name}\n") is None  # another indentation
    assert kept.restore(f"class A:\n    {name}\n    {name}\n") is None  # twice
    assert kept.restore("class A:\n    pass\n") is None  # gone
    assert kept.restore(f"class A:\n    x = {name}\n") is None  # not a line of its own


FIXTURES = ROOT / "fixtures"
REAL = sorted(p for d in ("corpus", "programs", "realistic") for p in (FIXTURES / d).rglob("*.py"))


@pytest.mark.parametrize("target", ["tpu", "portable"])
@pytest.mark.parametrize("path", REAL, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_real_files_give_what_a_whole_parse_gives(monkeypatch, path: Path, target):
    """Every definition worth anything left out (MIN_CHARS 0), on real torch_xla code."""
    monkeypatch.setattr(skeleton, "MIN_CHARS", 0)
    text = path.read_text(encoding="utf-8")
    assert rewrite(text, target) == rewrite(text, target, whole=True)


def test_every_fixture_gives_what_a_whole_parse_gives(monkeypatch):
    monkeypatch.setattr(skeleton, "MIN_CHARS", 0)
    differ = []
    for path in sorted((FIXTURES / "rewrite").rglob("*.in.py")):
        text = path.read_text(encoding="utf-8")
        for target in ("tpu", "portable"):
            if rewrite(text, target) != rewrite(text, target, whole=True):
                differ.append(f"{path.relative_to(FIXTURES)} ({target})")
    assert differ == []


def test_libcst_parses_only_what_the_walk_needs(monkeypatch):
    """The characters handed to libcst for three real files: inside the definitions the walk
    enters, the statements it does not change stay out too (the rest: module-level code,
    imports, docstrings, the statements the rules change, the templates of new code). Parsing
    those definitions whole handed libcst 95% of these files' text; 54% now (an `if` on the
    device kind folded to its branch in the first: the branch's left-out statements parsed
    where they go)."""
    parsed = []
    parse = skeleton.cst.parse_module
    monkeypatch.setattr(skeleton.cst, "parse_module", lambda text, *a, **k: parsed.append(len(text)) or parse(text, *a, **k))
    total = 0
    for name in ("pytorch__xla__test__test_mp_all_gather.py", "huggingface__accelerate__src__accelerate__checkpointing.py",
                 "huggingface__optimum-tpu__examples__text-generation__generation.py"):
        text = (FIXTURES / "corpus" / name).read_text(encoding="utf-8")
        total += len(text)
        output, _ = rewrite(text)
        assert output != text
    assert sum(parsed) < 0.65 * total, f"{sum(parsed) / total:.0%} of the text parsed by libcst"
