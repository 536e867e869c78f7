"""A module imported by an SPMD program: its process queries counted hosts too, so they keep a
TODO naming the program, though the module itself shows no SPMD (rewrite/spmd_programs.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes
from tpu_migrate.rewrite.spmd_programs import spmd_modules

TRAIN = """\
import torch_xla.runtime as xr
from pkg import utils
from pkg.models import net

xr.use_spmd()
print(utils.host(), net)
"""
UTILS = """\
import torch_xla.runtime as xr
from . import helpers


def host():
    return xr.global_ordinal(), xr.world_size()
"""
HELPERS = "import torch_xla.core.xla_model as xm\nRANK = xm.get_ordinal()\n"
IMPORTED_BY_TRAIN = "train.py imports this module and runs SPMD (one process per host)"
# Asks whether SPMD is on, and runs either way: not an SPMD program.
ASKS = "import torch_xla.runtime as xr\nimport pkg.other\nprint(xr.is_spmd())\n"


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.fixture
def project(tmp_path) -> Path:
    write(tmp_path, {"train.py": TRAIN, "asks.py": ASKS, "pkg/__init__.py": "", "pkg/utils.py": UTILS,
                     "pkg/helpers.py": HELPERS, "pkg/other.py": HELPERS, "pkg/models/__init__.py": "",
                     "pkg/models/net.py": "net = 1\n", "src/README.md": ""})
    return tmp_path


def real(root: Path, name: str) -> str:
    return os.path.realpath(root / name)


def test_the_modules_an_spmd_program_imports_are_found_through_packages_and_relative_imports(project):
    found = dict(spmd_modules([], project))
    assert found == {real(project, name): IMPORTED_BY_TRAIN for name in (
        "pkg/__init__.py", "pkg/utils.py", "pkg/helpers.py", "pkg/models/__init__.py", "pkg/models/net.py")}


def test_without_a_project_root_the_run_s_own_files_are_looked_at(project):
    assert spmd_modules([str(project / "pkg" / "utils.py")], None) == ()
    found = dict(spmd_modules([str(project / "train.py"), str(project / "pkg" / "utils.py")], None))
    assert found[real(project, "pkg/utils.py")] == IMPORTED_BY_TRAIN


def test_a_process_query_in_an_imported_module_keeps_a_todo_naming_the_program(project):
    options = Options(spmd_modules=spmd_modules([], project))
    path = str(project / "pkg" / "utils.py")
    result = rewrite_bytes(UTILS.encode(), path, options)
    assert [(m.code, m.line) for m in result.manual] == [("TPU021", 6), ("TPU020", 6)]
    assert result.manual[0].message.startswith("train.py imports this module and runs SPMD (one process per host)")
    assert "xr.global_ordinal(), xr.world_size()" in result.output.decode()
    # The same module, not imported by an SPMD program, converts.
    alone = rewrite_bytes(UTILS.encode(), path, Options())
    assert alone.manual == [] and "dist.get_rank()" in alone.output.decode()


@pytest.mark.slow
def test_the_command_finds_the_program_from_the_project_root_and_the_cache_follows_it(cli, project):
    """A pre-commit run passes only the changed module: the SPMD script beside it still counts,
    and when the script starts SPMD later, the module's cached result is not reused."""
    (project / ".git").mkdir()
    (project / "train.py").write_text(TRAIN.replace("xr.use_spmd()\n", ""))
    before = cli("rewrite", "--check", "pkg/utils.py", cwd=project).stdout.decode()
    assert "pkg/utils.py:6:12 TPU021 fixable" in before, before
    (project / "train.py").write_text(TRAIN)
    after = cli("rewrite", "--check", "utils.py", cwd=project / "pkg").stdout.decode()
    assert "utils.py:6:12 TPU021 train.py imports this module and runs SPMD" in after, after
    assert "0 fix(es)" in after


def test_a_tree_too_large_to_scan_falls_back_to_the_run_s_files(project, monkeypatch):
    from tpu_migrate.rewrite import project as project_files

    monkeypatch.setattr(project_files, "MAX_FILES", 3)
    assert spmd_modules([str(project / "pkg" / "utils.py")], project) == ()


def test_virtual_environments_and_hidden_directories_are_not_the_project(project):
    program = "import torch_xla.runtime as xr\nimport lonely\nxr.use_spmd()\n"
    write(project, {"lonely.py": "", "venv/pyvenv.cfg": "home = /usr\n", "venv/lib/spmd.py": program,
                    ".tox/py311/lib/spmd.py": program})
    assert real(project, "lonely.py") not in dict(spmd_modules([], project))
    write(project, {"tools/spmd.py": program})  # the same program in the project: it counts
    assert dict(spmd_modules([], project))[real(project, "lonely.py")].startswith(
        f"{os.path.join('tools', 'spmd.py')} imports this module")


def test_a_fifo_or_device_named_like_a_module_is_not_read(project):
    """Opening a FIFO for reading waits for a writer: the project pass must not."""
    import threading

    os.mkfifo(project / "pkg" / "fifo.py")
    (project / "null.py").symlink_to("/dev/null")
    found = []
    scan = threading.Thread(target=lambda: found.append(dict(spmd_modules([], project))), daemon=True)
    scan.start()
    scan.join(20)
    assert found and real(project, "pkg/utils.py") in found[0]


def test_a_program_that_turns_spmd_on_through_another_module_runs_spmd(tmp_path):
    """main.py calls trainer.train(), which calls setup.start() (xr.use_spmd()): main.py, trainer.py
    and the modules main.py imports run SPMD, though none names it; a script that imports none of
    them does not."""
    write(tmp_path, {
        "tools/setup.py": "import torch_xla.runtime as xr\n\n\ndef start():\n    xr.use_spmd()\n",
        "trainer.py": "from tools import setup\n\n\ndef train():\n    setup.start()\n",
        "main.py": "import trainer\nimport metrics\n\ntrainer.train()\n",
        "metrics.py": "import torch_xla.runtime as xr\nWORLD = xr.world_size()\n",
        "eval.py": "import metrics\n",
    })
    found = dict(spmd_modules([], tmp_path))
    through_setup = f"this file imports {os.path.join('tools', 'setup.py')}, which turns SPMD on (one process per host)"
    assert found == {real(tmp_path, "trainer.py"): through_setup, real(tmp_path, "main.py"): through_setup,
                     real(tmp_path, "metrics.py"): "main.py imports this module and runs SPMD (one process per host)",
                     real(tmp_path, "tools/setup.py"): "main.py imports this module and runs SPMD (one process per host)"}
    result = rewrite_bytes((tmp_path / "metrics.py").read_bytes(), str(tmp_path / "metrics.py"),
                           Options(spmd_modules=tuple(found.items())))
    assert [m.code for m in result.manual] == ["TPU020"] and result.manual[0].message.startswith("main.py imports")


def test_a_directory_the_program_adds_to_sys_path_is_searched(tmp_path):
    """pytorch/xla's examples/fsdp/train_decoder_only_fsdp_v2.py adds its parent directory to
    sys.path and imports the base trainer from there."""
    program = ("import sys\nimport os\n"
               "example_folder = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))\n"
               "sys.path.append(example_folder)\nfrom train_base import Trainer\n"
               "import torch_xla.runtime as xr\nxr.use_spmd()\n")
    write(tmp_path, {
        "examples/fsdp/train_fsdp_v2.py": program,
        "examples/train_base.py": "import torch_xla.runtime as xr\nWORLD = xr.world_size()\n",
        "examples/tools/run.py": ("import sys\nfrom pathlib import Path\n"
                                  "sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'lib'))\n"
                                  "import helpers\nimport torch_xla.runtime as xr\nxr.use_spmd()\n"),
        "examples/lib/helpers.py": "",
        "examples/lib/unused.py": "",
    })
    found = dict(spmd_modules([], tmp_path))
    assert set(found) == {real(tmp_path, "examples/train_base.py"), real(tmp_path, "examples/lib/helpers.py")}


def test_a_notebook_that_turns_spmd_on_is_a_program(tmp_path):
    """Its code cells are read as one module (magics and shell lines left out): the modules it
    imports run SPMD, and so does a notebook that imports a module turning SPMD on."""
    import json

    def notebook(*sources):
        cells = [{"cell_type": "code", "source": source, "metadata": {}, "outputs": [], "execution_count": None}
                 for source in sources]
        return json.dumps({"cells": [{"cell_type": "markdown", "source": "# SPMD", "metadata": {}}, *cells],
                           "metadata": {}, "nbformat": 4, "nbformat_minor": 5})

    write(tmp_path, {
        "train.ipynb": notebook("!pip install torch_xla\n%env PJRT_DEVICE=TPU",
                                ["import torch_xla.runtime as xr\n", "import metrics\n", "xr.use_spmd()"],
                                "%%bash\necho not python: import unused"),
        "metrics.py": "import torch_xla.runtime as xr\nWORLD = xr.world_size()\n",
        "unused.py": "",
        "setup_spmd.py": "import torch_xla.runtime as xr\n\n\ndef start():\n    xr.use_spmd()\n",
        "explore.ipynb": notebook("import setup_spmd\nsetup_spmd.start()"),
        "broken.ipynb": "{not json",
    })
    found = dict(spmd_modules([], tmp_path))
    assert found == {real(tmp_path, "metrics.py"): "train.ipynb imports this module and runs SPMD (one process per host)",
                     real(tmp_path, "explore.ipynb"): "this file imports setup_spmd.py, which turns SPMD on (one process per host)",
                     real(tmp_path, "setup_spmd.py"): "explore.ipynb imports this module and runs SPMD (one process per host)"}


QUERY = "import torch_xla.runtime as xr\nWORLD = xr.world_size()\n"


@pytest.mark.parametrize("program", [
    # A launcher that sets the variable and imports the trainer, which imports torch_xla.
    'import os\nos.environ["XLA_USE_SPMD"] = "1"\nimport trainer\n',
    "import os\nos.environ.update(XLA_USE_SPMD='1')\nimport trainer\n",
    # The SPMD module imported from its package: no dotted path names it whole.
    "from torch_xla.distributed import spmd as xs\nimport trainer\n",
    # The module that turns SPMD on, and the trainer, imported by name.
    "import importlib\nimportlib.import_module('setup_spmd').start()\ntrainer = __import__('trainer')\n",
    # The variable's name not spelled whole in the bytes (the text test before the parse lets it by).
    '# spmd launcher\nimport os\nos.environ["XLA_USE_" "SPMD"] = "1"\nimport trainer\n',
    '# spmd launcher\nimport os\nos.environ["\\x58LA_USE_SPMD"] = "1"\nimport trainer\n',
    "from optimum.tpu import fsdp_v2\nimport trainer\n",
], ids=["environ", "environ-update", "from-package", "importlib", "environ-in-pieces", "environ-escaped", "optimum"])
def test_the_forms_a_program_turns_spmd_on_and_imports_by(tmp_path, program):
    write(tmp_path, {"run.py": program, "trainer.py": QUERY,
                     "setup_spmd.py": "import torch_xla.runtime as xr\n\n\ndef start():\n    xr.use_spmd()\n"})
    assert dict(spmd_modules([], tmp_path))[real(tmp_path, "trainer.py")].startswith("run.py imports this module")


def test_each_module_is_read_once_however_many_programs_import_it(tmp_path, monkeypatch):
    """20 SPMD programs import one chain of 20 modules: each file's imports are found once (a walk
    per program per module was quadratic: 2,900 programs x 2,900 modules in transformers' tree),
    and each module names the first program."""
    from tpu_migrate.rewrite import spmd_programs

    chain = {f"m{i}.py": f"import m{i + 1}\n" for i in range(20)}
    programs = {f"p{i:02}.py": "import torch_xla.distributed.spmd as xs\nimport m0\n" for i in range(20)}
    write(tmp_path, {**chain, "m20.py": "import m0\n", **programs})  # a cycle back to m0
    walks = []
    local_imports = spmd_programs._local_imports
    monkeypatch.setattr(spmd_programs, "_local_imports", lambda path, *rest: walks.append(path) or local_imports(path, *rest))
    found = dict(spmd_modules([], tmp_path))
    assert sorted(walks) == sorted(set(walks)) and len(walks) == len(chain) + 1 + len(programs)
    assert found == {real(tmp_path, f"m{i}.py"): "p00.py imports this module and runs SPMD (one process per host)"
                     for i in range(21)}


def _first_by_walks(programs, graph):
    """The first program reaching each module, as one walk per program finds it (the reference)."""
    found = {}
    for program in sorted(programs):
        seen, queue = {program}, [program]
        while queue:
            for child in graph.get(queue.pop(), ()):
                if child not in seen:
                    seen.add(child)
                    found.setdefault(child, program)
                    queue.append(child)
    return found


@pytest.mark.parametrize("seed", range(60))
def test_the_first_program_through_the_import_graph_is_the_one_walks_find(seed):
    """Cycles through programs included: a program never names itself, another in its cycle does."""
    import random

    from tpu_migrate.rewrite.spmd_programs import _first_importers

    rng = random.Random(seed)
    nodes = [f"n{i:02}" for i in range(rng.randint(1, 30))]
    graph = {node: rng.sample(nodes, rng.randint(0, min(3, len(nodes)))) for node in nodes}
    programs = rng.sample(nodes, rng.randint(1, len(nodes)))
    assert _first_importers(programs, graph.get) == _first_by_walks(programs, graph)


def test_the_import_statements_come_in_ast_walk_s_order():
    import ast

    from tpu_migrate.rewrite.spmd_programs import import_statements

    tree = ast.parse("import a\ntry:\n    import b\nexcept E:\n    import c\nelse:\n    import d\n"
                     "finally:\n    import e\nif x:\n    def f():\n        import g\nelse:\n    import h\n"
                     "match y:\n    case 1:\n        import i\nclass C:\n    import j\nimport k\n")
    assert import_statements(tree) == [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_files_that_say_a_module_s_name_without_importing_it_are_not_parsed(tmp_path, monkeypatch):
    """The SPMD module is `lib/device.py`: 30 files say `device` and import nothing, and are not
    parsed (in this repository the word test let 1,045 files through, for 331 now). Every form
    that can import it still counts: through its folder's name, from its folder or below it, a
    directory added to sys.path, a symbolic link to its folder; the answer is the one the word
    test alone gives."""
    from tpu_migrate.rewrite import spmd_programs

    write(tmp_path, {
        "lib/__init__.py": "", "lib/sub/__init__.py": "",
        "lib/device.py": "import torch_xla.runtime as xr\n\n\ndef start():\n    xr.use_spmd()\n",
        "a.py": "from lib import device\n", "lib/b.py": "from . import device\n",
        "lib/sub/c.py": "from .. import device\n" + QUERY,
        "tools/d.py": "import os\nimport sys\n\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'lib'))\n"
                      "import device\n",
        "tools/e.py": "from linked import device\n",
        **{f"other{i}.py": "device = 'cpu'\n" for i in range(30)},
    })
    (tmp_path / "linked").symlink_to(tmp_path / "lib", target_is_directory=True)
    from tpu_migrate.rewrite import project as project_files

    parsed = []
    parse = project_files.parse
    monkeypatch.setattr(project_files, "parse", lambda path, *rest: parsed.append(path) or parse(path, *rest))
    found = spmd_modules([], tmp_path)
    assert not [path for path in parsed if "other" in path]
    assert {path for path, why in found if why.startswith("this file imports lib/device.py")} == {
        real(tmp_path, name) for name in ("a.py", "lib/b.py", "lib/sub/c.py", "tools/d.py", "tools/e.py")}
    monkeypatch.setattr(spmd_programs._Named, "MAX_NAMES", -1)  # the word test alone
    assert spmd_modules([], tmp_path) == found
    assert len([path for path in parsed if "other" in path]) == 30


def parses(monkeypatch) -> list[str]:
    """The paths the project passes parse, as they parse them."""
    from tpu_migrate.rewrite import project as project_files

    parsed = []
    parse = project_files.parse
    monkeypatch.setattr(project_files, "parse", lambda path, *rest: parsed.append(path) or parse(path, *rest))
    return parsed


def test_a_file_that_says_spmd_only_in_words_is_not_parsed(tmp_path, monkeypatch):
    """A file names SPMD's modules, calls or variable in code only where its bytes spell them
    (plain ASCII source): one that says `spmd` and `torch_xla` in a comment is not parsed (this
    repository's own code says them in strings); a notebook, whose JSON may escape any
    character, still is."""
    write(tmp_path, {"notes.py": "# torch_xla's spmd mode shards the batch\nX = 1\n",
                     "notes.ipynb": '{"cells": [{"cell_type": "code", "source": "# spmd"}]}',
                     "run.py": "import torch_xla.distributed.spmd as xs\n"})
    parsed = parses(monkeypatch)
    assert spmd_modules([], tmp_path) == ()
    assert sorted(map(os.path.basename, parsed)) == ["notes.ipynb", "run.py"]


def test_a_skipped_or_linked_folder_s_name_counts_only_as_a_whole_word(tmp_path, monkeypatch):
    """An import may pass through what the walk did not list (`build/`, skipped; `env`, a link to
    lib/): a file that names one as a word (`from env import device`) is parsed; one that only
    says `environment` or `rebuild` is not (each was, while the names were matched anywhere)."""
    write(tmp_path, {"lib/device.py": "import torch_xla.runtime as xr\n\n\ndef start():\n    xr.use_spmd()\n",
                     "build/x.py": "", "a.py": "from env import device\n",
                     **{f"other{i}.py": "device = 'cpu'\nenvironment = rebuild = 1\n" for i in range(5)}})
    (tmp_path / "env").symlink_to(tmp_path / "lib", target_is_directory=True)
    parsed = parses(monkeypatch)
    found = dict(spmd_modules([], tmp_path))
    assert found[real(tmp_path, "a.py")] == ("this file imports lib/device.py, which turns SPMD on (one process "
                                              "per host)")
    assert not [path for path in parsed if "other" in path]


def test_a_module_that_says_sys_and_path_but_adds_no_directory_is_not_walked_whole(tmp_path, monkeypatch):
    """Only a file that may call `sys.path.append / insert` or an import function has its whole
    tree walked for those calls; `sys` and `path` apart are common (`import sys`, `os.path`)."""
    from tpu_migrate.rewrite import spmd_programs

    write(tmp_path, {"run.py": "import torch_xla.distributed.spmd as xs\nimport plain\nimport adds\n",
                     "plain.py": "import os\nimport sys\n\nprint(sys.argv, os.path.sep)\n",
                     "adds.py": "import os\nimport sys\n\nsys . path.append(os.path.dirname(__file__) + '/lib')\n"})
    walked = []
    import_nodes = spmd_programs._import_nodes
    monkeypatch.setattr(spmd_programs, "_import_nodes", lambda tree: walked.append(tree) or import_nodes(tree))
    found = dict(spmd_modules([], tmp_path))
    assert set(found) == {real(tmp_path, "plain.py"), real(tmp_path, "adds.py")}
    assert len(walked) == 1  # adds.py (run.py names no sys.path)


def test_the_byte_searches_find_what_their_line_anchored_patterns_find():
    """project._from_lines and spmd_programs._SYS_PATH start from their literal (a search for
    bytes), their line start and look-behind checked after: the same matches as `^[ \\t]*from...`
    (multiline) and `(?<![A-Za-z0-9_])sys...`, on this repository's code and on the cases where
    a `from` does not start its line."""
    import re
    from pathlib import Path

    from tpu_migrate.rewrite import project, spmd_programs

    anchored = re.compile(rb"^[ \t]*" + project._FROM_IMPORT.pattern, re.MULTILINE)
    behind = re.compile(rb"(?<![A-Za-z0-9_])" + spmd_programs._SYS_PATH.pattern.replace(rb"(?<![A-Za-z0-9_]sys)", b""))
    root = Path(__file__).resolve().parent.parent
    texts = [path.read_bytes() for path in sorted((root / "tpu_migrate" / "rewrite").glob("*.py"))]
    texts += [b"# from a import (\nfrom b import c\n)", b"x = 1; from a import b", b"xfrom a import b\nfrom c import d",
              b"  from .x import (a,\n b as c)\n", b"\rfrom a import b", b"from a import b; from c import d\n  from e import f",
              b"sys.path", b"xsys.path _sys.path sys .  path", b"sys.paths", b"sys\\\n.path", b"\xffsys.path"]
    for text in texts:
        assert [m.groups() for m in project._from_lines(text)] == [m.groups() for m in anchored.finditer(text)]
        assert [m.span() for m in spmd_programs._SYS_PATH.finditer(text)] == [m.span() for m in behind.finditer(text)]
    assert [m[2] for m in project._from_lines(texts[-11])] == [b"b"]  # the comment's `from` is not a line's
