"""Real runs: public torch_xla training scripts, migrated as a user would migrate them.

fixtures/programs/real/ holds copies of public scripts (see its SOURCES.md), edited only so
they run on a CPU in seconds with fake data. For each script in SCRIPTS:

1. the original runs with torch_xla on XLA:CPU (PJRT_DEVICE=CPU, one process: torch_xla
   hangs with more CPU processes);
2. a copy of the whole tree is migrated with `tpu-migrate rewrite --target portable` (one
   run over the directory, as a user would run it over a repository);
3. the migrated script runs with torch_xla blocked (tests/differential.py's blocking package),
   so a leftover import fails the run instead of silently using torch_xla;
4. the losses (and accuracies) the two runs print are compared, in order, by `tpu-migrate
   verify`'s comparison of printed numbers.

The scripts print in their own formats (`Loss=2.30259`, `loss: tensor(6.9078, device=...)`),
which are kept: `printed_values` finds `loss` / `accuracy` followed by `=` or `:` and a
number. Two printed numbers match when they differ by at most one unit in the last printed
place plus the script's relative tolerance (XLA:CPU rounds float32 reductions differently from
eager CPU; bfloat16 autocast needs more).

`python tests/real_runs.py [SCRIPT ...]` prints the table (exit 1 when a script does not run
or does not match); `python tests/real_runs.py --share PATH ...` prints the share of torch_xla
references the portable rewrite converts over files or directories (see `share`).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (str(HERE), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import differential as harness  # noqa: E402
import shared_runs  # noqa: E402
from fidelity import MIGRATED, bound_name, rewrite_text  # noqa: E402
from tpu_migrate.verify import printed  # noqa: E402

REAL = harness.PROGRAMS / "real"
RUN_TIMEOUT = 300  # seconds per run, a hang guard: every script takes well under 30 s on idle XLA:CPU, 2-4x that beside the other worker
FLOAT32 = 1e-4
VALUE = re.compile(
    r"\b(loss|accuracy)\b\s*[=:]\s*(?:tensor\()?\s*(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)", re.IGNORECASE
)
ERROR_LINE = re.compile(r"^\s*([\w.]+(?:Error|Exception|Exit|Interrupt))\b:?.*$", re.MULTILINE)


@dataclass(frozen=True)
class Script:
    path: str                      # relative to fixtures/programs/real/
    args: tuple[str, ...] = ()
    rtol: float = FLOAT32

    @property
    def name(self) -> str:
        return " ".join([self.path.split("/")[-1], *self.args])


# Not run, only counted by --share: their originals fail on XLA:CPU with torch_xla 2.9.
# train_resnet_amp.py: torch_xla's autocast on a CPU device ("AMP only supported for XLA:TPU")
# raises AttributeError: 'autocast' object has no attribute 'device'. train_resnet_ddp.py: DDP
# inside torch_xla.compile(full_graph=True) raises "Unexpected execution happens inside the
# compiled function".
NOT_RUNNABLE = ("pytorch_xla/examples/train_resnet_amp.py", "pytorch_xla/examples/data_parallel/train_resnet_ddp.py")

MNIST_FLAGS = ("--fake_data", "--num_cores", "1", "--num_epochs", "1", "--batch_size", "32", "--log_steps", "5")

SCRIPTS = (
    Script("pytorch_xla/test/test_train_mp_mnist.py", MNIST_FLAGS),
    Script("pytorch_xla/test/test_train_mp_mnist.py", (*MNIST_FLAGS, "--ddp")),
    Script("pytorch_xla/test/test_train_mp_mnist_zero1.py", MNIST_FLAGS),
    Script("pytorch_xla/test/test_train_mp_mnist_fsdp_with_ckpt.py",
           (*MNIST_FLAGS, "--ckpt_prefix", "ckpt/final_ckpt")),
    Script("pytorch_xla/examples/train_resnet_base.py"),
    Script("pytorch_xla/examples/data_parallel/train_resnet_xla_ddp.py"),
    Script("pytorch_xla/examples/train_decoder_only_base.py",
           ("--hidden-size", "64", "--intermediate-size", "128", "--num-layers", "1")),
    Script("pytorch_xla/examples/eager/train_decoder_only_eager.py"),
    Script("pytorch_xla/examples/eager/train_decoder_only_eager_with_compile.py"),
    Script("pytorch_xla/examples/eager/train_decoder_only_eager_multi_process.py"),
)


@dataclass
class Outcome:
    script: Script
    runs: bool = False
    matches: bool = False
    error: str = ""                # the migrated run's first exception line, when it fails
    remaining: int = 0             # torch_xla references left in the migrated script
    imports_xla: bool = False      # the migrated script still imports torch_xla
    original_ok: bool = True
    problems: list[str] = field(default_factory=list)


# --- Printed values --------------------------------------------------------------------------


def printed_values(output: str) -> list[tuple[str, float, float]]:
    """(kind, value, unit in the last printed place) for each loss / accuracy printed."""
    values = []
    for kind, number in VALUE.findall(output):
        mantissa = number.lower().split("e")[0]
        decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
        exponent = int(number.lower().split("e")[1]) if "e" in number.lower() else 0
        values.append((kind.lower(), float(number), 10.0 ** (exponent - decimals)))
    return values


def compare_values(original: str, migrated: str, rtol: float) -> list[str]:
    """The losses and accuracies, in order, compared by `tpu-migrate verify`'s own comparison of
    printed numbers (tpu_migrate/verify/printed.py): within rtol or a unit of the last digit."""
    a, b = (printed.lines("".join(f"{kind.lower()} {number}\n" for kind, number in VALUE.findall(output)))
            for output in (original, migrated))
    problems = []
    if not a:
        problems.append("the original printed no loss")
    result = printed.compare(a, b, set(), rtol, 0.0, world=1)
    if result.one_side or len(a) != len(b):
        problems.append(f"{len(a)} values printed by the original, {len(b)} by the migrated script")
    if result.divergence is not None:
        mismatch = result.divergence
        problems.append(f"value {mismatch.line - 1} ({mismatch.text.split()[0]}): {mismatch.original!r} vs "
                        f"{mismatch.migrated!r}")
    return problems


def first_error(output: str) -> str:
    found = ERROR_LINE.search(output)
    if found:
        return found.group(0).strip()
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


# --- torch_xla references ------------------------------------------------------------------


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def xla_references(source: str) -> list[tuple[int, str]]:
    """(line, qualified name) for each use of a name bound by a torch_xla / optimum.tpu import:
    `xm.optimizer_step` through `import torch_xla.core.xla_model as xm` is
    torch_xla.core.xla_model.optimizer_step. Imports themselves are not references."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(MIGRATED):
                    name = bound_name(alias, node)
                    bound[name] = alias.name if alias.asname else name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(MIGRATED):
            for alias in node.names:
                if alias.name != "*":
                    bound[bound_name(alias, node)] = f"{node.module}.{alias.name}"
    inner = set()  # the Name / Attribute nodes inside a longer dotted chain
    found = []
    for node in ast.walk(tree):
        if id(node) in inner or not isinstance(node, (ast.Attribute, ast.Name)):
            continue
        chain = _dotted(node)
        if chain is None or chain[0] not in bound:
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            continue
        inner.update(id(n) for n in ast.walk(node))
        found.append((node.lineno, ".".join([bound[chain[0]], *chain[1:]])))
    return sorted(found)


def imports_xla(source: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.startswith(MIGRATED) for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(MIGRATED):
            return True
    return False


# --- Runs ----------------------------------------------------------------------------------


def migrate_tree(source: Path, destination: Path, target: str = "portable") -> Path:
    """Copy the tree and rewrite it with one CLI run over the directory."""
    shutil.copytree(source, destination)
    proc = subprocess.run(
        [sys.executable, "-m", "tpu_migrate", "rewrite", "--target", target, "--jobs", "1", "--no-cache",
         str(destination)],
        capture_output=True, text=True, env={**harness._env({}), "PYTHONPATH": str(ROOT)},
        timeout=harness.TIMEOUT,
    )
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"tpu-migrate failed: {proc.stdout}\n{proc.stderr}")
    return destination


def original_run(script: Script) -> harness.Run:
    """The original on XLA:CPU, once per test session (test_real_runs compares the migrated
    script with it, test_diagnose_steps the script under diagnose), in a copy of the tree of its
    own: the scripts write checkpoints beside themselves, never into the repository."""
    def run() -> harness.Run:
        with tempfile.TemporaryDirectory(prefix="tpu-migrate-real-original-") as tmp:
            tree = Path(tmp) / "original"
            shutil.copytree(REAL, tree)
            return harness.run_bounded(tree / script.path, harness.original_mp_env(),
                                       list(script.args), timeout=RUN_TIMEOUT)

    return shared_runs.once(f"real original {_tree_key()} {script.path} {json.dumps(script.args)}", run)


@functools.cache
def _tree_key() -> str:
    """Changes when any file of the tree does (a script imports its neighbours)."""
    digest = hashlib.sha256()
    for path in sorted(REAL.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(REAL)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


class Workspace:
    """A migrated copy of fixtures/programs/real/, made once (the originals run in copies of
    their own: original_run)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.migrated = migrate_tree(REAL, directory / "migrated")

    def run_migrated(self, script: Script) -> harness.Run:
        env = harness._mp_env({"PYTHONPATH": str(harness.blocker_dir(self.directory)),
                               "MASTER_PORT": str(harness.free_port())})
        return harness.run_bounded(self.migrated / script.path, env, list(script.args), timeout=RUN_TIMEOUT)

    def static(self, script: Script, outcome: Outcome) -> Outcome:
        text = (self.migrated / script.path).read_text(encoding="utf-8")
        outcome.remaining = len(xla_references(text))
        outcome.imports_xla = imports_xla(text)
        return outcome

    def migrated_outcome(self, script: Script) -> tuple[Outcome, harness.Run]:
        """The migrated run alone: does it run, and with which error."""
        run = self.run_migrated(script)
        outcome = self.static(script, Outcome(script, runs=run.returncode == 0))
        if not outcome.runs:
            outcome.error = first_error(run.output) or f"exit status {run.returncode}"
        return outcome, run

    def outcome(self, script: Script) -> Outcome:
        # The two runs are independent processes: side by side they take half the wall time
        # on two cores (the compiled scripts spend most of it compiling).
        with ThreadPoolExecutor(max_workers=2) as pool:
            original = pool.submit(original_run, script)
            outcome, migrated = self.migrated_outcome(script)
            original = original.result()
        if original.returncode != 0:
            outcome.original_ok = False
            outcome.problems.append(f"the original failed: {first_error(original.output)}\n{original.output[-2000:]}")
        if outcome.runs:
            outcome.problems += compare_values(original.output, migrated.output, script.rtol)
            outcome.matches = outcome.original_ok and not outcome.problems
        return outcome


def table(outcomes: list[Outcome]) -> str:
    width = max(len(o.script.name) for o in outcomes)
    rows = [f"{'script':<{width}}  {'runs':<4}  {'matches':<7}  {'refs left':>9}  {'imports xla':<11}  error"]
    for o in outcomes:
        rows.append(f"{o.script.name:<{width}}  {'yes' if o.runs else 'no':<4}  {'yes' if o.matches else 'no':<7}  "
                    f"{o.remaining:>9}  {'yes' if o.imports_xla else 'no':<11}  {o.error}")
    runs, matches = sum(o.runs for o in outcomes), sum(o.matches for o in outcomes)
    rows.append(f"\n{len(outcomes)} scripts: {runs} run, {matches} match")
    return "\n".join(rows)


# --- Share of references converted ---------------------------------------------------------

SPMD_FSDP_RULES = frozenset({"TPU170", "TPU171", "TPU172", "TPU173", "TPU174", "TPU175", "TPU176", "TPU177",
                             "TPU178", "TPU179", "TPU180"})


def is_spmd_fsdp(qualname: str) -> bool:
    """A reference the rules for SPMD / FSDP (TPU170-TPU180) cover: xs.*, use_spmd,
    the FSDP wrappers, optimum's fsdp_v2."""
    from tpu_migrate.rules import load_catalog

    catalog = load_catalog()
    rule = catalog.lookup(catalog.canonical(qualname))
    return rule is not None and rule.code in SPMD_FSDP_RULES


@dataclass
class Share:
    files: int = 0
    before: dict[str, int] = field(default_factory=lambda: {"other": 0, "spmd/fsdp": 0})
    after: dict[str, int] = field(default_factory=lambda: {"other": 0, "spmd/fsdp": 0})

    left: Counter = field(default_factory=Counter)  # qualified names still referenced after

    def add(self, before: str, after: str) -> None:
        self.files += bool(xla_references(before))
        for counts, text in ((self.before, before), (self.after, after)):
            for _, name in xla_references(text):
                counts["spmd/fsdp" if is_spmd_fsdp(name) else "other"] += 1
        self.left.update(name for _, name in xla_references(after))

    def converted(self, kind: str) -> tuple[int, int]:
        return max(self.before[kind] - self.after[kind], 0), self.before[kind]


def python_files(paths: list[Path]) -> list[Path]:
    files = []
    for path in paths:
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def share(paths: list[Path], target: str = "portable") -> Share:
    """References to torch_xla / optimum.tpu names in the files before and after the rewrite
    (in-process, the same engine as the CLI): the converted share is 1 - after / before, with
    the SPMD / FSDP references (no automatic conversion exists) counted apart."""
    result = Share()
    for path in python_files(paths):
        data = path.read_bytes()
        if b"torch_xla" not in data and b"optimum" not in data:
            continue
        output = rewrite_text(data, path.name, target)
        result.add(data.decode("utf-8"), output.decode("utf-8"))
    return result


def share_report(result: Share) -> str:
    lines = [f"{result.files} files with torch_xla / optimum.tpu references"]
    total_done = total = 0
    for kind in ("other", "spmd/fsdp"):
        done, before = result.converted(kind)
        total_done, total = total_done + done, total + before
        lines.append(f"  {kind:<10} {done:>5} of {before:>5} references converted ({_percent(done, before)})")
    lines.append(f"  {'all':<10} {total_done:>5} of {total:>5} references converted ({_percent(total_done, total)})")
    lines.append("most frequent references left:")
    lines += [f"  {count:>5}  {name}" for name, count in result.left.most_common(15)]
    return "\n".join(lines)


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "n/a"


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python tests/real_runs.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--share", nargs="+", type=Path, metavar="PATH",
                        help="print the share of references converted over these files / directories")
    parser.add_argument("--target", choices=["tpu", "portable"], default="portable", help="for --share")
    parser.add_argument("scripts", nargs="*", help="script names (default: all in SCRIPTS)")
    args = parser.parse_args(argv)
    if args.share:
        print(share_report(share(args.share, args.target)))
        return 0
    chosen = [s for s in SCRIPTS if not args.scripts or s.path.split("/")[-1] in args.scripts]
    with tempfile.TemporaryDirectory(prefix="tpu-migrate-real-") as tmp:
        workspace = Workspace(Path(tmp))
        outcomes = []
        for script in chosen:
            outcomes.append(workspace.outcome(script))
            print(f"[{len(outcomes)}/{len(chosen)}] {script.name}: runs={outcomes[-1].runs} "
                  f"matches={outcomes[-1].matches}", file=sys.stderr, flush=True)
    print(table(outcomes))
    for o in outcomes:
        for problem in o.problems:
            print(f"  {o.script.name}: " + problem.replace("\n", "\n    "))
    return 0 if all(o.matches for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
