"""The static fidelity check (tests/fidelity.py): first the checker itself, on small input /
output pairs, each check shown to catch its violation and to pass what it must; then every
realistic, program and public-corpus file, rewritten for both targets."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyflakes import messages as pyflakes_messages
from pyflakes.checker import Checker

from conftest import ROOT
from fidelity import (
    changed_manual_calls,
    default_inputs,
    fidelity_problems,
    manual_calls,
    stale_imports,
    unmarked_device_strings,
    without_reviewed,
)
import static_fidelity


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# --------------------------------------------------------------------------------------------
# (a) stale imports


def test_stale_function_local_import_is_caught():
    before = src("""
        def device():
            import torch_xla.core.xla_model as xm
            return xm.xla_device()
    """)
    after = src("""
        import torch
        def device():
            import torch_xla.core.xla_model as xm
            return torch.device("tpu")
    """)
    [problem] = stale_imports(before, after)
    assert problem.startswith("line 3: import torch_xla.core.xla_model as xm")
    assert "device" in problem


def test_stale_imports_are_judged_per_function():
    before = src("""
        def a():
            import torch_xla.core.xla_model as xm
            return xm.xla_device()
        def b():
            import torch_xla.core.xla_model as xm
            xm.rendezvous("x")
    """)
    after = src("""
        import torch
        def a():
            import torch_xla.core.xla_model as xm
            return torch.device("tpu")
        def b():
            import torch_xla.core.xla_model as xm
            # TODO(tpu-migrate): TPU106 ...
            xm.rendezvous("x")
    """)
    assert [p.split(":")[0] for p in stale_imports(before, after)] == ["line 3"]


def test_stale_module_and_try_block_imports_are_caught():
    before = src("""
        try:
            import torch_xla.core.xla_model as xm
        except ImportError:
            xm = None
        from torch_xla import runtime as xr
        def f():
            return xm.xla_device(), xr.world_size()
    """)
    after = src("""
        import torch
        import torch.distributed as dist
        try:
            import torch_xla.core.xla_model as xm
        except ImportError:
            xm = None
        from torch_xla import runtime as xr
        def f(xr):
            return torch.device("tpu"), xr.world_size()
    """)
    problems = stale_imports(before, after)
    assert [p.split(":")[0] for p in problems] == ["line 4", "line 7"]  # xr in f is the parameter


def test_used_and_side_effect_imports_pass():
    before = src("""
        import torch_xla.distributed.xla_backend
        import torch_xla.core.xla_model as xm
        from torch_xla.distributed.parallel_loader import MpDeviceLoader
        def f(x):
            def inner():
                return xm.all_reduce(xm.REDUCE_SUM, x)
            return inner
        def g(loader) -> "MpDeviceLoader":
            return loader
    """)
    after = before.replace("import torch_xla.core", "import torch\nimport torch_xla.core")
    assert stale_imports(before, after) == []
    assert stale_imports(before, before) == []


def test_class_body_import_is_not_visible_in_methods():
    before = src("""
        class A:
            import torch_xla.core.xla_model as xm
            device = xm.xla_device()
            def f(self):
                return xm
    """)
    after = before.replace("device = xm.xla_device()", 'device = "tpu"')
    [problem] = stale_imports(before, after)  # the method's xm is a global, not the class's
    assert problem.startswith("line 2:") and "A" in problem


def test_an_unused_import_the_input_did_not_have_is_caught():
    after = "import torch_xla.core.xla_model as xm\n"
    assert len(stale_imports("import torch\n", after)) == 1


# --------------------------------------------------------------------------------------------
# (b) manual calls


def test_changed_argument_of_manual_call_is_caught():
    before = src("""
        import torch_xla.core.xla_model as xm
        def f(x, g):
            return xm.all_reduce(xm.REDUCE_SUM, x, groups=g)
    """)
    after = src("""
        import torch_xla.core.xla_model as xm
        import torch.distributed as dist
        def f(x, g):
            # TODO(tpu-migrate): TPU100 convert by hand
            return xm.all_reduce(dist.ReduceOp.SUM, x, groups=g)
    """)
    [problem] = changed_manual_calls(before, after)
    assert problem == "line 5: xm.all_reduce(dist.ReduceOp.SUM, x, groups=g)  (not in the input as written)"


def test_manual_calls_compare_as_multisets():
    before = src("""
        from torch_xla.core import xla_model
        xla_model.rendezvous("a")
    """)
    after = before + 'xla_model.rendezvous("a")\n'
    assert [p.split(":")[0] for p in changed_manual_calls(before, after)] == ["line 3"]


def test_unchanged_manual_and_converted_calls_pass():
    before = src("""
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr
        def f(x, g):
            n = xr.world_size()
            return xm.all_reduce(xm.REDUCE_SUM, x, groups=g), n
    """)
    after = src("""
        import torch_xla.core.xla_model as xm
        import torch.distributed as dist
        def f(x, g):
            n = dist.get_world_size()
            # TODO(tpu-migrate): TPU100 convert by hand
            return xm.all_reduce(xm.REDUCE_SUM, x, groups=g), n
    """)
    assert changed_manual_calls(before, after) == []


def test_manual_calls_follow_scopes():
    source = src("""
        import torch_xla.core.xla_model as xm
        def f(xm):
            return xm.thing(1)
        def g():
            return xm.other(2)
    """)
    assert [text for _, text in manual_calls(source)] == ["xm.other(2)"]


# --------------------------------------------------------------------------------------------
# (c) device and backend strings


def test_unmarked_device_strings_are_caught():
    output = src("""
        import torch
        import torch.distributed as dist
        device = torch.device("xla")
        other = torch.device('xla:1')
        def f(i):
            dist.init_process_group(
                "xla")
            return f"xla:{i}"
    """)
    assert [p.split(":")[0] for p in unmarked_device_strings(output)] == ["line 3", "line 4", "line 7", "line 8"]


def test_marked_and_exempt_strings_pass():
    output = src('''
        """Runs on "xla" devices."""
        import torch

        # TODO(tpu-migrate): TPU002 a device string
        device = torch.device(
            "xla:0")
        other = torch.device("xla")  # tpu-migrate: ignore
        def f(states):
            """xla"""
            states["xla"] = 1
            return states["xla"], "xla_device", "xla://", "openxla"
        # TODO(tpu-migrate): TPU099 a decorator
        @decorate("xla")
        def g():
            pass
        if kind == "xla":  # tpu-migrate: ignore
            pass
    ''')
    assert unmarked_device_strings(output) == []


def test_ignore_comment_in_a_block_does_not_cover_its_header():
    output = src("""
        if kind == "xla":
            x = 1  # tpu-migrate: ignore
    """)
    assert [p.split(":")[0] for p in unmarked_device_strings(output)] == ["line 1"]


# --------------------------------------------------------------------------------------------
# all four together


def test_fidelity_problems_runs_every_check():
    before = src("""
        import torch
        import torch_xla.core.xla_model as xm
        def f(x):
            xm.mark_step()
            return xm.all_reduce(xm.REDUCE_SUM, x), torch.device("xla")
        def g():
            import torch_xla.core.xla_model as xm
            return xm.xla_device()
    """)
    after = src("""
        import torch
        import torch_xla.core.xla_model as xm
        import torch.distributed as dist
        def f(x):
            return xm.all_reduce(dist.ReduceOp.SUM, x), torch.device("xla")
        def g():
            import torch_xla.core.xla_model as xm
            return torch.device("tpu")
    """)
    problems = fidelity_problems(before, after)
    kinds = sorted({p.split(": line")[0] for p in problems})
    assert kinds == ["changed manual call", "stale import", "unmarked device string", "unmarked reference"], problems
    clean = src("""
        import torch
        import torch.distributed as dist
        def f(x):
            dist.all_reduce(x)
            return x
    """)
    assert fidelity_problems(clean, clean) == []


def test_command_line_compare_prints_problems(tmp_path):
    before, after = tmp_path / "in.py", tmp_path / "out.py"
    before.write_text('import torch\nd = torch.device("xla")\n')
    after.write_text('import torch\nd = torch.device("xla")\n')
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fidelity.py"), "--compare", str(before), str(after)],
        capture_output=True, text=True,
    )
    assert run.returncode == 1, run.stderr
    assert "unmarked device string" in run.stdout and 'line 2: d = torch.device("xla")' in run.stdout


def test_command_line_rewrites_and_tabulates(tmp_path):
    program = tmp_path / "prog.py"
    program.write_text("import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n")
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fidelity.py"), "--target", "tpu", str(program)],
        capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "prog.py" in run.stdout and "1 file(s), 1 target(s), 0 problem(s)" in run.stdout


# --------------------------------------------------------------------------------------------
# Every realistic, program and public-corpus file


INPUTS = default_inputs()


def rewrite(data: bytes, name: str, target: str) -> bytes:
    return static_fidelity.rewrite(data, name, target)[0]  # shared with test_static_fidelity


def undefined_names(source: bytes) -> set[str]:
    checker = Checker(ast.parse(source), filename="case.py")
    return {m.message_args[0] for m in checker.messages if isinstance(m, pyflakes_messages.UndefinedName)}


def test_the_corpus_is_there():
    corpus = [p for p in INPUTS if p.parent.name == "corpus"]
    assert len(corpus) >= 20
    listed = (ROOT / "fixtures" / "corpus" / "SOURCES.md").read_text()
    assert all(f"`{p.name}`" in listed for p in corpus)


@pytest.mark.parametrize("target", ["tpu", "portable"])
@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_rewrite_is_faithful(path: Path, target: str):
    original = path.read_bytes()
    output = rewrite(original, path.name, target)
    failures = []
    try:
        ast.parse(output)
    except SyntaxError as error:
        pytest.fail(f"the output does not parse: {error}")
    if rewrite(output, path.name, target) != output:
        failures.append("a second run changed the output")
    introduced = undefined_names(output) - undefined_names(original)
    if introduced:
        failures.append(f"new undefined names: {sorted(introduced)}")
    failures += without_reviewed(path.name, fidelity_problems(original.decode("utf-8"), output.decode("utf-8")))
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)
