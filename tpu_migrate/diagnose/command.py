"""`tpu-migrate diagnose` and `tpu-migrate report merge`, behind the click face in cli.py.

The machine formats (JSON on stdout, SARIF, GitHub annotations) are printed by the cli, which
owns the report package; this module returns what they need.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import json
import os
import sys

from rich.console import Console

from tpu_migrate import standin
from tpu_migrate.diagnose import analysis, costs, report, runner


class DiagnoseError(Exception):
    """A usage problem, reported in one line with exit status 2."""


def run_diagnose(target, args, module, warmup_steps, output_format, output, explain,
                 html_file, backend="auto", python=None) -> tuple[int, str, list[analysis.Finding]]:
    """Run the program under the tracer and print the text report; returns the program's exit
    status (shell convention), the JSON document and the findings. `python`: the Python that runs
    the program on the TorchTPU stand-in (backend standin; default: standin.find_python's)."""
    if module is None and target is None:
        raise DiagnoseError("give a SCRIPT or -m MODULE")
    if module is not None:
        args = [target, *args] if target is not None else args
        target = module
        if importlib.util.find_spec(module.split(".")[0]) is None and not os.path.exists(module.split(".")[0]):
            raise DiagnoseError(f"no module named '{module}'")
    elif not os.path.isfile(target):
        raise DiagnoseError(f"no such script: {target}")
    if backend == "auto":
        backend = auto_backend(_source_of(target, module is not None))
    if python is not None and backend != "standin":
        raise DiagnoseError(f"--python runs the program on the TorchTPU stand-in: it needs --backend standin "
                            f"(the backend is {backend})")
    if backend == "xla" and importlib.util.find_spec("torch_xla") is None:
        raise DiagnoseError("torch_xla is not installed: pip install 'tpu-migrate[xla]' (torch 2.9.0 + torch-xla 2.9.0)")
    if backend == "standin":
        if python is not None and not standin.fits(python):
            raise DiagnoseError(f"--python {python}: not a Python with torch 2.11 to 2.15, which the TorchTPU "
                                "stand-in needs (as torch-tpu 0.2.0 does)")
        try:
            python = python or standin.find_python(None, create=True,
                                                   echo=lambda line: print(line, file=sys.stderr))
        except standin.StandInError as exc:
            raise DiagnoseError(str(exc)) from None
    elif backend != "xla" and importlib.util.find_spec("torch") is None:
        raise DiagnoseError("torch is not installed: the native backend traces PyTorch programs")
    for flag, path in (("--output", output), ("--html", html_file)):
        _check_writable(flag, path)  # before the program runs, not after an hour of it
    stdout = sys.stderr if output_format != "text" else None  # machine output owns stdout
    evidence = runner.run(target, list(args), module is not None, stdout=stdout, explain=explain,
                          backend=backend, warmup_steps=warmup_steps, python=python)
    # A program killed by a signal reports -N; the shell convention is 128 + N.
    status = evidence.exit_code if evidence.exit_code >= 0 else 128 - evidence.exit_code
    try:
        document, findings = _report(evidence, target, module, warmup_steps, output, html_file)
    except Exception as exc:  # noqa: BLE001 - a fault of ours costs the report, never the run's status
        sys.stderr.write(f"tpu-migrate diagnose: no report: {type(exc).__name__}: {exc} (a bug in "
                         "tpu-migrate; the exit status is the program's)\n")
        return status, None, []
    return status, document, findings


def _report(evidence, target, module, warmup_steps, output, html_file) -> tuple[str, list[analysis.Finding]]:
    """Analyse the evidence, write the report files and print the text report; the JSON
    document and the findings. A report file that cannot be written is a line on stderr."""
    backend, device = analysis.backend(evidence)
    summary = analysis.summarize(evidence, warmup_steps)
    findings, steps = summary.findings, summary.steps
    script = os.path.abspath(target) if module is None else target
    rank = torchrun_rank()
    if rank is not None:  # started by torchrun: this process is one rank of the job
        for finding in findings:
            finding.rank = rank if finding.rank is None else finding.rank
        root, extension = os.path.splitext(output or "tpu-migrate-diagnose.json")
        output = f"{root}.rank{rank}{extension or '.json'}"
    records = analysis.step_records(evidence)
    run_costs = costs.measure(summary, records, evidence.events, backend, device)
    notes = [*evidence.notes, *summary.notes]  # what evidence was lost comes first
    # The warm-up the analysis used (longer than asked when optimizer state came late: a note says).
    document = report.json_document(script, evidence.exit_code, steps, summary.warmup_end, findings, rank,
                                    backend, device, notes, run_costs, summary.optimizer_steps)
    _write(output, lambda: document + "\n")
    if html_file:
        from tpu_migrate.diagnose import html

        _write(html_file, lambda: html.render(script, records, summary.warmup_end, findings,
                                              evidence.exit_code, backend, steps, run_costs,
                                              summary.optimizer_steps))
    report.print_report(Console(stderr=True, soft_wrap=True), script, steps, summary.warmup_end,
                        findings, analysis.timeline(records), backend, device, notes, run_costs,
                        summary.optimizer_steps, summary.host_only)
    return document, findings


def _check_writable(flag: str, path: str | None) -> None:
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise DiagnoseError(f"cannot write {flag} {path}: no such directory {directory}")
    if not os.access(directory, os.W_OK):
        raise DiagnoseError(f"cannot write {flag} {path}: {directory} is not writable")


def _write(path: str | None, text) -> int:
    """Write a report file; a failure (the directory went away during the run, a full disk) is
    one line on stderr, and the report still goes to the terminal and stdout. Returns 1 if so
    (`report merge` then fails; diagnose keeps the program's exit status)."""
    if not path:
        return 0
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text())
    except OSError as exc:
        sys.stderr.write(f"tpu-migrate diagnose: cannot write {path}: {exc.strerror or exc}\n")
        return 1
    return 0


def _source_of(target: str, module: bool) -> bytes:
    """The script's (or the module's) source, or b"" where it cannot be read."""
    path = target
    if module:
        spec = importlib.util.find_spec(target) if not os.path.exists(target) else None
        path = spec.origin if spec is not None and spec.origin else target
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def auto_backend(source: bytes) -> str:
    """`--backend auto`, from the script's (or module's) source:

    - xla for a program that imports torch_xla (an import statement, anywhere in the file: a
      docstring or comment that names torch_xla, as the helpers tpu-migrate writes do, is no
      import; a torch_xla import elsewhere still switches the child from native to xla);
    - standin for one that targets TorchTPU's `tpu` device: it imports torch_tpu, or names the
      device in its code (a string "tpu" or "tpu:N", as in `torch.device("tpu")`, `.to("tpu")`,
      `device="tpu"`; `torch.tpu...`; a `.tpu()` call);
    - else auto (native, or xla if the program turns out to import torch_xla).

    A file that does not parse is looked at as text: `import torch_xla` / `from torch_xla`."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        text = source.decode("utf-8", "replace")
        return "xla" if "import torch_xla" in text or "from torch_xla" in text else "auto"
    imported = set()
    tpu = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            tpu = tpu or _names_tpu_device(node.value)
        elif isinstance(node, ast.Attribute) and node.attr == "tpu":
            tpu = tpu or isinstance(node.value, ast.Name) and node.value.id == "torch"  # torch.tpu
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "tpu":
            tpu = True  # model.tpu()
    if "torch_xla" in imported:
        return "xla"
    return "standin" if tpu or "torch_tpu" in imported else "auto"


def _names_tpu_device(text: str) -> bool:
    return text == "tpu" or (text.startswith("tpu:") and text[4:].isdigit())


def torchrun_rank() -> int | None:
    if "TORCHELASTIC_RUN_ID" in os.environ and os.environ.get("RANK", "").isdigit():
        return int(os.environ["RANK"])
    return None


def merge_reports(directory: str, output: str | None, output_format: str) -> None:
    """Merge the per-rank JSON reports `diagnose` wrote under torchrun."""
    _check_writable("--output", output)
    documents = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        try:
            with open(path, encoding="utf-8") as handle:
                document = json.load(handle)
        except (OSError, ValueError) as exc:
            raise DiagnoseError(f"{path}: not a diagnose report: {exc}") from None
        if isinstance(document, dict) and "findings" in document and "version" in document:
            documents.append(document)
    if not documents:
        raise DiagnoseError(f"{directory}: no diagnose report (*.json) found")
    merged = report.merge_documents(documents)
    text = json.dumps(merged, indent=2)
    if output_format == "json":
        sys.stdout.write(text + "\n")
    else:
        report.print_merged(Console(soft_wrap=True), merged)
    if _write(output, lambda: text + "\n"):
        sys.exit(2)
