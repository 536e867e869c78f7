"""Engine properties: bytes in, bytes out; what survives; what is refused and how."""

from __future__ import annotations

import ast

import pytest

from tpu_migrate.rewrite import engine, transforms
from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes

SOURCE = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()  # here\nxm.mark_step()\n"


def run(data: bytes, **options):
    return rewrite_bytes(data, "t.py", Options(**options))


def test_crlf_line_endings_are_preserved():
    result = run(SOURCE.replace("\n", "\r\n").encode())
    assert result.changed
    assert b"\r\n" in result.output and b"\n" not in result.output.replace(b"\r\n", b"")
    assert result.output == b'import torch\r\n\r\ndevice = torch.device("tpu")  # here\r\n'


def test_cr_only_line_endings_are_preserved():
    result = run(SOURCE.replace("\n", "\r").encode())
    assert result.output == b'import torch\r\rdevice = torch.device("tpu")  # here\r'
    assert run(result.output).changed is False


def test_bom_is_preserved():
    result = run(b"\xef\xbb\xbf" + SOURCE.encode())
    assert result.output.startswith(b"\xef\xbb\xbfimport torch\n")


def test_missing_trailing_newline_stays_missing():
    result = run(SOURCE.rstrip("\n").encode() + b"\nx = xm.xla_device()")
    assert result.output.endswith(b'x = torch.device("tpu")')


def test_pep263_encoding_is_kept():
    source = "# -*- coding: latin-1 -*-\nimport torch_xla.core.xla_model as xm\nname = 'caf\xe9'\nd = xm.xla_device()\n"
    result = run(source.encode("latin-1"))
    assert result.error is None
    assert "name = 'caf\xe9'".encode("latin-1") in result.output
    assert result.output.decode("latin-1").count("caf\xe9") == 1


def test_files_without_torch_xla_are_not_parsed_at_all():
    # Not even valid Python: the pre-filter skips it before any parser sees it.
    result = run(b"def (:\n")
    assert result.error is None and not result.changed


@pytest.mark.parametrize("neuron_import", ["from torch_neuronx.utils import get_platform_target",
                                           "import neuronx_distributed.parallel_layers as nxd",
                                           "from optimum.neuron import NeuronTrainer"])
def test_aws_neuron_code_is_left_as_it_is_with_a_warning(neuron_import):
    """torch_xla also drives AWS Neuron (PJRT_DEVICE=NEURON): its `xla` device and mark_step are a
    NeuronCore's, not a TPU's (neuronx-distributed's parallel_state.py was rewritten to `tpu`)."""
    data = (f"import torch\nimport torch_xla.core.xla_model as xm\n{neuron_import}\n\n"
            "xm.mark_step()\nt = torch.rand([1], device=\"xla\")\n").encode()
    result = rewrite_bytes(data, "neuron.py", Options())
    assert not result.changed and not result.fixes and not result.manual and result.error is None
    assert [(note.line, "AWS Neuron" in note.message) for note in result.notes] == [(3, True)]


def test_syntax_error_is_reported_with_its_line():
    result = run(b"import torch_xla\n\nx = (1,\n")
    assert result.error.startswith("syntax error at line")
    assert not result.changed


def test_undecodable_file_is_an_error():
    result = run(b"import torch_xla\nx = '\xff\xfe'\n")
    assert "cannot decode" in result.error


def test_wrong_coding_cookie_is_an_error():
    result = run(b"# -*- coding: no-such-codec -*-\nimport torch_xla\n")
    assert result.error is not None and "no-such-codec" in result.error


def test_output_that_does_not_parse_keeps_the_original(monkeypatch):
    """Fault injection: a transform that builds a node libcst prints as invalid Python."""
    import libcst as cst

    def broken(call, qualname, sc, rule):
        sc.fixed(rule.code, qualname)
        return cst.Attribute(value=cst.Integer("1"), attr=cst.Name("real"))  # prints `1.real`

    monkeypatch.setitem(transforms.CALL, "device_call", broken)
    result = run(SOURCE.encode())
    assert not result.changed and result.output is None
    assert result.error.startswith("internal error: the rewritten file does not parse")
    assert result.fixes == [] and result.manual == []


@pytest.mark.parametrize("tail, parsed", [
    ("", 1),
    ("await step(xm.xla_device())\n", 2), ("await step()\n", 1),
    ("if xm.xla_device() is 1:\n    pass\n", 2), ("if device is 1:\n    pass\n", 1),
    ("from __future__ import annotations\n", 2),
], ids=["plain", "top-level-await", "top-level-await-copied", "compiler-warning", "compiler-warning-copied",
        "late-future-import"])
def test_the_output_check_builds_no_ast_unless_compile_refuses_or_warns(monkeypatch, tail, parsed):
    """compile() checks the printed output without ast's objects; where it refuses what parses
    (a notebook's top-level await) or warns, ast.parse decides as before: same output, no warning.
    Statements the printer copied whole are not checked again (they parsed in the input)."""
    import warnings

    parses = []
    parse = ast.parse
    monkeypatch.setattr(engine.ast, "parse", lambda text, *rest, **kw: parses.append(text) or parse(text, *rest, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = run((SOURCE + tail).encode())
    parses = [text for text in parses if text.endswith("\n")]  # modules: not a test's constant folding
    out_tail = tail.replace("xm.xla_device()", 'torch.device("tpu")')
    assert result.changed and result.error is None and result.output.decode().endswith(out_tail)
    assert len(parses) == parsed  # the input's; the output's only where compile balks
    assert engine._late_future_import(parse(SOURCE + tail)) == tail.startswith("from __future__")


def test_generated_code_that_does_not_parse_is_an_internal_error(monkeypatch):
    """Fault injection: a rule that parses text it built wrong. The input parsed, so this is not
    the user's syntax error: it is reported as the tool's, and the file is kept."""
    from tpu_migrate.rewrite.context import parse_expr

    def broken(call, qualname, sc, rule):
        sc.fixed(rule.code, qualname)
        return parse_expr("torch.device(")

    monkeypatch.setitem(transforms.CALL, "device_call", broken)
    result = run(SOURCE.encode())
    assert not result.changed and result.output is None
    assert result.error.startswith("internal error: the rewritten file does not parse (a rule generated code")
    assert result.error_line is None and result.fixes == [] and result.manual == []


@pytest.mark.parametrize("fault", ["comment", "value"])
def test_a_rule_s_node_libcst_refuses_is_an_internal_error_not_the_file_s(monkeypatch, fault):
    """Fault injection: a rule builds a node libcst refuses (a comment holding a line break: a
    CSTValidationError, which is a SyntaxError) or raises ValueError. The input parsed: the
    error is the tool's, not "syntax error" or "cannot parse" blaming the user's file."""
    import libcst as cst

    def broken(call, qualname, sc, rule):
        sc.fixed(rule.code, qualname)
        if fault == "comment":
            cst.Comment("# a TODO\nover two lines")
        raise ValueError("a rule's own mistake")

    monkeypatch.setitem(transforms.CALL, "device_call", broken)
    result = run(SOURCE.encode())
    assert not result.changed and result.output is None
    assert result.error.startswith("internal error: ") and result.error.endswith("; left unchanged")
    assert ("CSTValidationError" if fault == "comment" else "ValueError: a rule's own mistake") in result.error
    assert result.fixes == [] and result.manual == []
    assert run(b"import torch_xla\nx = 1\x00\n").error == "cannot parse: source code string cannot contain null bytes"
    assert run(b"import torch_xla\nx = (\n").error.startswith("syntax error at line 2")


def test_second_run_changes_nothing():
    first = run(SOURCE.encode())
    assert run(first.output).changed is False


def test_fix_and_manual_lines_refer_to_the_input():
    source = (
        "import torch_xla.core.xla_model as xm\n"
        "\n"
        "x = call(\n"
        "    1,\n"
        "    xm.xla_device(),\n"
        ")\n"
        "y = xm.unlazy([])\n"
    )
    result = run(source.encode())
    assert [(f.code, f.line, f.col) for f in result.fixes] == [("TPU001", 5, 5)]
    assert [(m.code, m.line, m.col) for m in result.manual] == [("TPU099", 7, 5)]


@pytest.mark.parametrize(
    "line, fixed",
    [
        ("d = xm.xla_device()  # tpu-migrate: ignore", False),
        ("d = xm.xla_device()  # tpu-migrate: ignore[TPU001]", False),
        ("d = xm.xla_device()  # tpu-migrate: ignore[TPU010]", True),
    ],
)
def test_suppression_comments(line, fixed):
    result = run(f"import torch_xla.core.xla_model as xm\n{line}\n".encode())
    assert bool(result.fixes) is fixed
    assert result.manual == []  # a suppressed reference is not reported either


def test_select_and_ignore():
    source = SOURCE.encode()
    only_step = run(source, select=frozenset({"TPU010"}))
    assert [f.code for f in only_step.fixes] == ["TPU010"]
    assert b"xm.xla_device()" in only_step.output
    no_step = run(source, ignore=frozenset({"TPU010"}))
    assert [f.code for f in no_step.fixes] == ["TPU001"]
    assert b"xm.mark_step()" in no_step.output


def test_used_imports_are_kept_and_unused_removed():
    source = (
        "import torch_xla.core.xla_model as xm\n"
        "import torch_xla.debug.metrics as met\n"
        "d = xm.xla_device()\n"
        "report = met.metrics_report()\n"
    )
    out = run(source.encode()).output.decode()
    assert "import torch_xla.core.xla_model as xm" not in out
    assert "import torch_xla.debug.metrics as met" in out


def test_partially_used_from_import_keeps_the_used_names():
    source = "from torch_xla.core.xla_model import xla_device, unlazy\nd = xla_device()\nunlazy([])\n"
    out = run(source.encode()).output.decode()
    assert "from torch_xla.core.xla_model import unlazy\n" in out


def test_a_guarded_import_with_nothing_left_to_guard_goes_whole():
    source = (
        "try:\n"
        "    import torch_xla.core.xla_model as xm\n"
        "except ImportError:\n"
        "    raise\n"
        "d = xm.xla_device()\n"
    )
    out = run(source.encode()).output.decode()
    assert out == 'import torch\nd = torch.device("tpu")\n'


def test_interesting_statements_that_need_no_change_keep_their_layout():
    source = 'import torch\nif True: foo("xla")\nrng = {"xla": 1}\n'
    assert run(source.encode()).changed is False


def test_walker_round_trips_real_code_when_every_statement_is_visited(monkeypatch):
    """Every statement of a real package goes through the statement walker and the expression
    rewriter (as if it mentioned torch_xla); with nothing to rewrite, the output must be the
    input, byte for byte. This pins the pairing of libcst and ast statements on real code."""
    from pathlib import Path

    import libcst

    from tpu_migrate.rewrite import engine, names

    monkeypatch.setattr(names.StmtInfo, "interesting", property(lambda self: True))
    monkeypatch.setattr(engine, "prefilter", lambda data: True)
    sources = sorted(Path(libcst.__file__).parent.glob("_nodes/*.py"))
    sources += sorted(Path(pytest.__file__).parent.glob("*.py"))[:10]
    assert len(sources) > 10
    for path in sources:
        data = path.read_bytes()
        result = engine.rewrite_bytes(data, str(path), Options())
        assert result.error is None, (path, result.error)
        assert not result.changed, path


def test_user_conditional_expression_statements_are_not_restructured():
    source = 'import torch\nprint("xla device") if verbose else None\nx = torch.ones(1).to("xla")\n'
    out = run(source.encode()).output.decode()
    assert 'print("xla device") if verbose else None\n' in out
    assert 'x = torch.ones(1).to("tpu")' in out


@pytest.mark.parametrize(
    "data, message",
    [
        (b"import torch_xla\nx = 1\x00\n", "cannot parse: source code string cannot contain null bytes"),
        (b"import torch_xla\nprint 'hello'\n", "syntax error at line 2: Missing parentheses"),
        (b"import torch_xla\nx = " + b"(" * 300 + b"1" + b")" * 300 + b"\n", "syntax error at line 2: too many nested"),
        (b"import torch_xla\nif True:\n\tx = 1\n        y = 2\n", "syntax error at line 4: inconsistent use of tabs"),
    ],
    ids=["nul-bytes", "python2", "deep-nesting", "mixed-tabs"],
)
def test_hostile_inputs_are_one_line_errors(data, message):
    result = run(data)
    assert result.error.startswith(message), result.error
    assert not result.changed and result.output is None


def test_empty_file_is_fine():
    assert run(b"").error is None and not run(b"").changed


def test_long_boolean_chains_are_refused_before_libcst_sees_them():
    """`a and b and ...` is one flat node in ast but a chain of nested nodes in libcst, whose
    native parser overflowed the C stack (a segfault) at ~8000 operands; the subprocess test in
    test_hostile_inputs.py runs that size. Here a size that is safe to try in-process."""
    data = b"import torch_xla.core.xla_model as xm\nd = xm.xla_device()\nx = " + b"a and " * 1500 + b"b\n"
    result = run(data)
    assert result.error == "too deeply nested to rewrite (over 1000 levels of nested expressions at line 3)"
    assert not result.changed and result.fixes == [] and result.manual == []


def test_too_large_files_are_refused_after_the_prefilter():
    big = SOURCE.encode() * 10
    assert run(big, max_file_size=100).error == f"too large to rewrite: {len(big)} bytes, over the 100 bytes limit (--max-file-size)"
    assert run(b"x = 1\n" * 100, max_file_size=10).error is None  # no torch_xla: never parsed
    assert run(big, max_file_size=None).changed


@pytest.mark.parametrize("separator", ["\x0c", "\x0b", "\x1c", "\x85", "\u2028"])
def test_odd_line_separators_in_comments_keep_the_second_run_a_no_op(separator):
    """Found by tests/test_properties.py: str.splitlines() breaks lines at a form feed (a ^L page
    break) and other separators Python does not count, so the comments above a statement were
    looked up at the wrong line and its TODO was added again on every run."""
    source = f"# header{separator}\n\nxm.unlazy([])\nimport torch_xla.core.xla_model as xm\n"
    first = run(source.encode())
    assert first.output.decode().count("TODO(tpu-migrate)") == 1
    assert run(first.output).changed is False


@pytest.mark.parametrize(
    "tail",
    ["\n  # a\n\n  # b\n", "\n    # old_code()\n    # more_old_code()\n", "\n  \n", "\n\t# c\n\n", "\n  # no newline"],
)
@pytest.mark.parametrize("last", ["", "def f():\n    return 1\n", "a = 1; \\\n  b = 2\n"])
def test_indented_comments_at_the_end_of_the_file_survive(tail, last):
    """Found by tests/test_properties.py: libcst 1.9 drops lines from the end of a file whose
    last lines are indented comments or blank lines with spaces (`x = 1\\n\\n  # a\\n\\n  # b\\n`
    prints as `x = 1\\n  # b\\n`); the engine puts the file's own end back."""
    result = run((SOURCE + last + tail).encode())
    assert result.output.decode() == 'import torch\n\ndevice = torch.device("tpu")  # here\n' + last + tail
    assert run(result.output).changed is False


def test_a_comment_above_the_import_after_a_removed_one_is_kept():
    """Found by tests/test_properties.py: a removed torch_xla import followed by a comment and
    another import, where the rewrite adds a standard-library group (`import os`): the comment
    was replaced by the blank line between the groups, and lost."""
    source = (
        "import torch_xla.core.xla_model as xm\n"
        "# the DDP wrapper\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "def step(optimizer, use_ddp):\n"
        "    if not use_ddp:\n"
        "        xm.optimizer_step(optimizer)\n"
    )
    output = run(source.encode(), target="tpu").output.decode()
    assert "# the DDP wrapper\n" in output and output.startswith("import os\n\n")
    assert run(output.encode(), target="tpu").changed is False


def test_a_form_feed_in_the_first_indentation_does_not_misalign_new_blocks():
    """Found by tests/test_properties.py: libcst takes the first block's indentation (here a form
    feed and a space, one column for Python) as the unit for the blocks rules add, which then did
    not line up (`if dist.is_initialized():` + `\\x0c dist.broadcast(...)`): the output did not
    parse and the file was refused."""
    source = (
        "import torch_xla.core.xla_model as xm\n"
        "class A:\n"
        "\x0c pass\n"
        "def sync(buffers):\n"
        "    xm.collective_broadcast(buffers, root_ordinal=1)\n"
    )
    result = run(source.encode())
    assert result.error is None and result.changed
    out = result.output.decode()
    assert out.startswith("import os\n\nimport torch.distributed as dist\n")
    assert "\nclass A:\n\x0c pass\n" in out  # kept as it was
    assert "    if _process_group():\n     for tensor in buffers:\n      dist.broadcast(tensor, src=1)\n" in out
    assert run(result.output).changed is False


@pytest.mark.parametrize(
    "source",
    [
        "import torch_xla.core.xla_model as xm\ndef f():\n    x = 1\n    \x0cy = 2\nd = xm.xla_device()\n",
        "import torch_xla.core.xla_model as xm\nd = xm.xla_device()\n\x0cpass\n",
        "import torch_xla.core.xla_model as xm\nd = xm.xla_device()\npass\n#\\\r\n",
    ],
    ids=["form-feed-in-block", "form-feed-last", "mixed-newlines-at-end"],
)
def test_files_libcst_cannot_print_back_are_refused(source):
    """Found by tests/test_properties.py: libcst 1.9 drops a form feed that starts a statement's
    line (`    \\x0cy = 2` came out as `y = 2`, moved out of its function) and the last line end
    of some files that mix \\r\\n and \\n. Such files are left alone, with an error."""
    result = run(source.encode())
    assert result.error.startswith("cannot rewrite: libcst does not print"), result.error
    assert not result.changed and result.output is None and result.fixes == [] and result.manual == []


def test_a_form_feed_on_its_own_line_is_fine():
    source = "import torch_xla.core.xla_model as xm\n\x0c\ndef f():\n    return xm.xla_device()\n"
    result = run(source.encode())
    assert result.output == b'import torch\n\x0c\ndef f():\n    return torch.device("tpu")\n'


@pytest.mark.parametrize(
    "handler",
    ["except A :", "except* A :", "except (A, B) \t:", "except (A  # a: b\n) :", "except A \\\n :",
     "except ....A :  # c"],
)
def test_the_space_before_an_except_colon_stays(handler):
    """Found by tests/test_properties.py: libcst 1.9 parses `except A :` (no `as`) without the
    space before the colon, which printed as `except A:`. Nested handlers are numbered in the
    file's order, and a file whose definitions are left out of libcst's parse keeps them too."""
    body = f"try:\n    pass\n{handler}\n    try: pass\n    except B  :\n        pass\n"
    long_def = "def g():\n" + "    y = 1\n" * 400 + f"    try: pass\n    {handler.replace(chr(10), chr(10) + '    ')}\n        pass\n"
    source = f"import torch_xla.core.xla_model as xm\n{body}{long_def}def f():\n    return xm.xla_device()\n{body}"
    result = run(source.encode())
    assert result.output == source.replace("import torch_xla.core.xla_model as xm\n", "import torch\n").replace(
        "xm.xla_device()", 'torch.device("tpu")').encode()


def _full_walk_too_deep(tree) -> bool:
    """The nesting count without the short-text shortcut (engine._check_nesting)."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        depth += len(node.values) - 1 if isinstance(node, ast.BoolOp) else 1
        if depth > engine.MAX_NESTING:
            return True
        stack.extend((child, depth) for child in ast.iter_child_nodes(node))
    return False


NESTING_SHAPES = {
    "unary": lambda n: "x = " + "-" * n + "y\n",  # one character per level: the tightest
    "not": lambda n: "x = " + "not " * n + "y\n",
    "or": lambda n: "x = " + " or ".join(["a"] * n) + "\n",
    "plus": lambda n: "x = " + "+".join(["a"] * n) + "\n",
    "subscript": lambda n: "x = a" + "[0]" * n + "\n",
    "call": lambda n: "x = f" + "()" * n + "\n",
    "attribute": lambda n: "x = a" + ".b" * n + "\n",
    "elif": lambda n: "if a:\n    pass\n" + "elif a:\n    pass\n" * n,
    "lambda": lambda n: "x = " + "lambda: " * n + "1\n",
    "decorator": lambda n: "@d(" + "-" * n + "a)\ndef f(): pass\n",  # above the def's own line
    "f-string": lambda n: "x = f'{" + "-" * n + "a}'\n",
    "indented": lambda n: "".join("    " * i + "if a:\n" for i in range(90)) + "    " * 90 + "x = " + "-" * n + "y\n",
    "non-ascii prefix": lambda n: "s = 'éééééé'; x = " + "-" * n + "y\n",
}


@pytest.mark.parametrize("shape", NESTING_SHAPES)
def test_the_nesting_check_skips_short_text_and_still_counts_like_the_full_walk(shape):
    for depth in (300, 900, 990, 998, 1000, 1002, 1500, 3000):
        text = NESTING_SHAPES[shape](depth)
        try:
            tree = ast.parse(text)
            expected = _full_walk_too_deep(tree)
        except (SyntaxError, RecursionError, MemoryError):
            continue  # Python itself refuses it
        try:
            engine._check_nesting(tree, text)
            refused = False
        except engine.TooDeep:
            refused = True
        assert refused == expected, (shape, depth)


def test_the_collector_is_mostly_idle_during_a_run_and_as_before_after(tmp_path):
    """gc_settings.fewer_collections, which paths.py runs the rewrite in: raised young-generation
    threshold and frozen start-up objects while files are rewritten; the caller's settings back
    afterwards, even when it stops early."""
    import gc

    from tpu_migrate.rewrite.gc_settings import YOUNG_COLLECTION_THRESHOLD
    from tpu_migrate.rewrite.paths import rewrite_paths

    files = []
    for n in range(2):
        files.append(str(tmp_path / f"f{n}.py"))
        (tmp_path / f"f{n}.py").write_text(SOURCE)
    before = gc.get_threshold()
    during = []
    for result in rewrite_paths(files, Options(), jobs=1):
        assert result.changed
        during.append((gc.get_threshold()[0], gc.get_freeze_count() > 0))
    assert during == [(YOUNG_COLLECTION_THRESHOLD, True)] * 2
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    run = rewrite_paths(files, Options(), jobs=1)
    next(run)
    run.close()  # a caller that stops after the first file
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_whole_file_scans_run_once_per_file_not_once_per_statement(monkeypatch):
    """Which functions wrap their model in DDP / FSDP is one scan of the file, whatever the
    number of optimizer steps: a scan per step made a dense 0.5 MiB file take 31 s instead of 11
    (benchmarks/bench_file_size.py: the growth per doubling went from 2.1 to 3.1)."""
    from tpu_migrate.rewrite.transforms import steps

    scans = []
    real = steps._wrapping_scopes
    monkeypatch.setattr(steps, "_wrapping_scopes", lambda *args: scans.append(1) or real(*args))
    body = "".join(f"def step_{i}(opt):\n    xm.optimizer_step(opt)\n" for i in range(50))
    result = run(("import torch_xla.core.xla_model as xm\n" + body).encode())
    assert len(result.fixes) == 50 and len(scans) == 1


def test_the_rewrite_grows_linearly_with_a_file_of_real_torch_xla_code():
    """Four times the same real definitions (benchmarks/real_code.py: functions and classes of
    fixtures/corpus/) cost at most 4.4 times the function calls of once: a count, not a time, so
    a loaded machine cannot flake it. Whole-file scans asked once per statement made it 5.8 (the
    statement's enclosing function, the loads of one call's statement, the attributes the file
    reads; 1 MiB took 13x the time of 0.25 MiB), now 3.6 (the shared imports are paid once)."""
    import cProfile
    import pstats

    from benchmarks.real_code import real_code

    once, four_times = (real_code(rounds=rounds, every=3).encode() for rounds in (1, 4))
    run(once, max_file_size=0)  # the rules' first use is not the file's cost
    calls = []
    for source in (once, four_times):
        profile = cProfile.Profile()
        profile.enable()
        result = run(source, max_file_size=0)
        profile.disable()
        assert result.error is None and result.fixes
        calls.append(pstats.Stats(profile).total_calls)
    assert calls[1] / calls[0] <= 4.4, calls


def test_a_finding_under_a_code_no_rule_declares_is_an_internal_error_for_that_file(monkeypatch):
    """A transform's typo (or a rule deleted from its table) would print a finding with no name
    and write it to SARIF: the file is refused instead, byte for byte as it was."""
    from tpu_migrate.rewrite.context import StatementContext

    fixed = StatementContext.fixed
    monkeypatch.setattr(StatementContext, "fixed",
                        lambda self, code, *args, **kw: fixed(self, "TPU999" if code == "TPU010" else code, *args, **kw))
    result = run(SOURCE.encode())
    assert result.error == "internal error: a rule wrote a finding under TPU999, which no rule table declares"
    assert not result.changed and not result.fixes
    assert run(b"import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n").changed  # the others go on


MEMORY_TODO = "# TODO(tpu-migrate): TPU150 device memory statistics have no CPU equivalent"


def test_a_todo_of_a_rule_this_run_converts_goes_and_a_person_s_comments_stay():
    """The portable target leaves `xm.get_memory_info()` with a TODO; the tpu target converts it,
    and with it goes that TODO (it is no longer open work), and only it: a person's own TODO,
    a TODO of another rule, and one not directly above the statement stay, and are still
    reported as open work (issue 49)."""
    source = (
        "import torch_xla.core.xla_model as xm\n\n\ndef report(device):\n"
        f"    # TODO: check the limit on v5e\n    {MEMORY_TODO}\n    info = xm.get_memory_info(device)\n"
        "    # TODO(tpu-migrate): TPU151 count the compilations by hand\n"
        f"    {MEMORY_TODO}\n    peak = xm.get_memory_info(device)['peak_bytes_used']\n"
        f"    {MEMORY_TODO}\n\n    return info, peak\n"
    )
    result = run(source.encode())
    text = result.output.decode()
    assert text.count(MEMORY_TODO) == 1 and "return info, peak" in text.split(MEMORY_TODO)[1]
    assert "    # TODO: check the limit on v5e\n    info = {" in text
    assert "    # TODO(tpu-migrate): TPU151 count the compilations by hand\n    peak = {" in text
    assert [(m.line, m.code) for m in result.manual] == [(8, "TPU151"), (11, "TPU150")]
    assert run(result.output).changed is False


def test_a_todo_stays_where_this_run_converts_its_rule_and_reports_it_again():
    """A rank read converted under a launch left torch_xla's is reported again (TPU021: every
    worker reads rank 0 of 1): the TODO of that rule above it, worded otherwise, stays for it."""
    old = "# TODO(tpu-migrate): TPU021 an earlier run's note on this read"
    source = (
        "import torch_xla.distributed.xla_multiprocessing as xmp\nimport torch_xla.runtime as xr\n\n\n"
        f"class Runner:\n    def shard(self, items):\n        {old}\n        return items[xr.global_ordinal():]\n\n"
        "    def worker(self, index, items):\n        return self.shard(items)\n\n"
        "    def run(self, items):\n        xmp.spawn(self.worker, args=(items,))\n"
    )
    result = run(source.encode())
    text = result.output.decode()
    assert f"        {old}\n        return items[_rank():]" in text, text
    assert text.count("TODO(tpu-migrate): TPU021") == 1
    assert [(m.line, m.code) for m in result.manual if m.code == "TPU021"] == [(8, "TPU021")]
