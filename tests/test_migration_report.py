"""`rewrite --html FILE` (the migration report) and the `migration` object of `--format json`,
through the real CLI on the realistic fixtures, some corpus files and a few small files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html import unescape
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from test_html_report import Collector

CORPUS = ["huggingface__accelerate__examples__finetune_lm_tpu.py",  # xr.use_spmd() goes, with a TODO
          "pytorch__xla__test__test_mp_replication.py",  # converts completely
          "huggingface__optimum-tpu__optimum__tpu__xla_logger.py"]
SPMD = """import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs

device = xm.xla_device()
t = torch.ones(4).to(device)
xs.mark_sharding(t, mesh, ("data",))
"""
CONVERTS = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nxm.mark_step()\n"
# Open manual work of an earlier run: a message and a file name with HTML's special characters.
ODD_NAME = "a<b&c>.py"
OPEN_TODO = "import os\n\n# TODO(tpu-migrate): TPU060 start <workers> & join them by hand\nos.getpid()\n"
NOTEBOOK = {
    "cells": [
        {"cell_type": "code", "id": "c1", "execution_count": None, "metadata": {}, "outputs": [],
         "source": ["import torch_xla.distributed.spmd as xs\n", "import torch_xla.core.xla_model as xm\n",
                    "device = xm.xla_device()"]},
        {"cell_type": "code", "id": "c2", "execution_count": None, "metadata": {}, "outputs": [],
         "source": ["xs.mark_sharding(t, mesh, (0,))"]},
    ],
    "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
}
BLOCKED = {"realistic/spmd_llama.py", "realistic/train_imagenet_mp.py", "realistic/trainer.py",
           "small/spmd.py", "small/nb.ipynb"}


def make_project(root: Path) -> Path:
    shutil.copytree(ROOT / "fixtures" / "realistic", root / "realistic")
    (root / "corpus").mkdir()
    for name in CORPUS:
        shutil.copy(ROOT / "fixtures" / "corpus" / name, root / "corpus" / name)
    small = root / "small"
    small.mkdir()
    (small / "spmd.py").write_text(SPMD)
    (small / "converts.py").write_text(CONVERTS)
    (small / ODD_NAME).write_text(OPEN_TODO)
    (small / "clean.py").write_text("import torch\n")
    (small / "nb.ipynb").write_text(json.dumps(NOTEBOOK))
    # What a directory run does not rewrite: a launch script and a config that mention torch_xla,
    # one that does not, and a data file that is never opened.
    (small / "launch.sh").write_text("#!/bin/sh\nset -e\nexport PJRT_DEVICE=TPU <&>\npython train.py\n")
    (small / "train.yaml").write_text("model:\n  layers: 2\n  device: xla\n")
    (small / "eval.yaml").write_text("model:\n  device: cuda\n")
    (small / "weights.bin").write_bytes(b"torch_xla\0" * 100)
    return root


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """(project, HTML text, JSON document) of one `rewrite --check --html --format json` run."""
    project = make_project(tmp_path_factory.mktemp("project"))
    result = run_cli("rewrite", "--check", "--html", "report.html", "--format", "json",
                     "realistic", "corpus", "small", cwd=project)
    assert result.returncode == 1, result.stderr
    return project, (project / "report.html").read_text(encoding="utf-8"), json.loads(result.stdout)


def _summary_cells(page: str) -> dict[str, str]:
    table = page[page.index('<table id="summary"'):]
    table = table[:table.index("</table>")]
    return {re.sub(r"<[^>]+>", "", unescape(label)).strip(): value
            for label, value in re.findall(r'<th scope="row">(.*?)</th><td class="count">(.*?)</td>', table)}


def test_the_totals_of_the_page_are_those_of_the_json(checked):
    _, page, doc = checked
    migration, summary = doc["migration"], doc["summary"]
    assert migration["mode"] == "check"
    assert migration["fixes"] == summary["fixes"] and migration["manual"] == summary["manual"]
    assert migration["files"] == summary["files"] == 4 + len(CORPUS) + 5
    assert migration["files_changed"] == summary["changed"]
    # The SPMD / FSDP items counted apart are those of the files.
    spmd_fsdp = {"TPU170", "TPU171", "TPU172", "TPU173", "TPU174", "TPU175", "TPU176", "TPU177", "TPU178",
                 "TPU179", "TPU180"}
    design = [m for f in doc["files"] for m in f["manual"] if m["code"] in spmd_fsdp]
    assert migration["manual_spmd_fsdp"] == len(design) >= 6
    assert sum(f["fixes"] for f in migration["families"]) == migration["fixes"]
    assert sum(f["manual"] for f in migration["families"]) == migration["manual"]
    assert sum(f["manual_spmd_fsdp"] for f in migration["families"]) == migration["manual_spmd_fsdp"]
    assert migration["converted_share"] == round(migration["fixes"] / (migration["fixes"] + migration["manual"]), 4)
    # Every file imports torch_xla but the TODO-only one and clean.py.
    assert migration["files_with_xla"] == migration["files"] - 2
    cells = _summary_cells(page)
    assert cells == {
        "files scanned": str(migration["files"]),
        "files that import torch_xla / optimum.tpu": str(migration["files_with_xla"]),
        "files with fixes or manual items": str(migration["files_with_work"]),
        "fixes the rewrite would apply (--check: nothing written)": str(migration["fixes"]),
        "manual items": str(migration["manual"]),
        "of which SPMD / FSDP (manual by design)": str(migration["manual_spmd_fsdp"]),
        "files that still import torch_xla after the rewrite (cannot run without it)": str(migration["blocked_files"]),
        "share of references converted (fixes / (fixes + manual items))": f"{migration['converted_share']:.0%}",
        "files that could not be processed (errors)": "0",
    }


def test_the_blocked_files_are_those_that_keep_a_torch_xla_import(checked):
    _, page, doc = checked
    blocked = {b["path"]: b["imports"] for b in doc["migration"]["blocked"]}
    assert set(blocked) == BLOCKED
    assert doc["migration"]["blocked_files"] == len(BLOCKED)
    # An SPMD call keeps its module; the device call's import went with the conversion.
    assert blocked["small/spmd.py"] == [{"line": 3, "module": "torch_xla.distributed.spmd"}]
    assert blocked["small/nb.ipynb"] == [{"line": 1, "module": "torch_xla.distributed.spmd", "cell": 0}]
    # Its SPMD converts (the loop's batch marking too, TPU184): Optimum's fsdp_v2 keeps it blocked.
    assert blocked["realistic/spmd_llama.py"] == [{"line": 8, "module": "optimum.tpu.fsdp_v2"}]
    rows = re.findall(r'<tr class="blocked"><td>(.*?)</td>', page)
    assert sorted(rows) == sorted(BLOCKED)


def test_families_follow_the_rule_files(checked):
    _, page, doc = checked
    families = {f["family"]: f for f in doc["migration"]["families"]}
    assert sum(f["manual_spmd_fsdp"] for f in families.values()) == doc["migration"]["manual_spmd_fsdp"]
    spmd = families["spmd"]
    sharding = next(r for r in spmd["rules"] if r["code"] == "TPU172")
    assert sharding["name"] == "spmd-sharding" and sharding["manual"] > 0 and sharding["fixes"] == 0
    assert next(r for r in families["device"]["rules"] if r["code"] == "TPU001")["fixes"] > 0
    # The TODO of an earlier run counts in its rule's family.
    assert next(r for r in families["launch"]["rules"] if r["code"] == "TPU060")["manual"] >= 1
    headers = re.findall(r'<tr class="family"><th>(.*?)</th><th class="count">(\d+)</th><th class="count">(\d+)</th>', page)
    assert [(unescape(h[0]), h[1], h[2]) for h in headers] == [
        (f["label"], str(f["fixes"]), str(f["manual"])) for f in doc["migration"]["families"]]


def _chart(page: str, chart: str) -> list[tuple[str, list[tuple[str, int]]]]:
    """(label, [(kind, count), ...]) per bar of the inline SVG chart `chart`."""
    svg = re.search(rf'<svg id="{chart}".*?</svg>', page, re.S)
    assert svg, chart
    bars = re.findall(r'<g class="bar"><title>(.*?):.*?</g>', svg.group(0), re.S)
    segments = re.findall(r'<g class="bar">(.*?)</g>', svg.group(0), re.S)
    return [(unescape(label), [(kind, int(n)) for kind, n in re.findall(r'<rect class="seg-(\w+)"[^>]*data-count="(\d+)"', g)])
            for label, g in zip(bars, segments)]


def test_the_picture_draws_the_numbers_of_the_tables(checked):
    _, page, doc = checked
    migration = doc["migration"]
    families = _chart(page, "chart-families")
    assert [label for label, _ in families] == [f["label"] for f in migration["families"]]
    for (_, segments), family in zip(families, migration["families"]):
        counts = dict(segments)
        assert counts.get("auto", 0) == family["fixes"]
        assert counts.get("manual", 0) + counts.get("design", 0) == family["manual"]
        assert counts.get("design", 0) == family["manual_spmd_fsdp"]
    # The files ranked by the manual work left in them, most first, as the JSON counts it.
    manual = {f["path"]: len(f["manual"]) for f in doc["files"]}
    files = _chart(page, "chart-files")
    ranked = [(path, sum(n for _, n in segments)) for path, segments in files]
    assert ranked == sorted(ranked, key=lambda item: (-item[1], item[0]))
    assert all(manual[path] == n for path, n in ranked)
    assert len(files) == min(12, sum(n > 0 for n in manual.values()))
    before, after = _chart(page, "chart-before-after")
    assert before[1] == [("before", migration["fixes"] + migration["manual"])]
    assert after[1] == [("after", migration["manual"])]
    # Families are named as users call them, in the chart and in the table.
    assert "AMP, RNG and compile" in page and ">amp_compile<" not in page


def test_scripts_and_configs_that_mention_torch_xla_are_listed_as_not_rewritten(checked):
    _, page, doc = checked
    assert doc["migration"]["not_rewritten"] == [
        {"path": "small/launch.sh", "line": 3, "text": "export PJRT_DEVICE=TPU <&>"},
        {"path": "small/train.yaml", "line": 3, "text": "device: xla"},
    ]
    rows = re.findall(r'<tr class="not-rewritten"><td>(.*?)</td><td class="count">(\d+)</td><td><code>(.*?)</code>', page)
    assert rows == [("small/launch.sh", "3", "export PJRT_DEVICE=TPU &lt;&amp;&gt;"), ("small/train.yaml", "3", "device: xla")]


def test_each_manual_item_is_listed_under_its_file_with_what_it_needs(checked):
    _, page, doc = checked
    parser = Collector()
    parser.feed(page)
    file_rows = [a for t, a in parser.tags if t == "tr" and "file" in a.get("class", "").split()]
    assert len(file_rows) == doc["migration"]["files"] - 1  # all but clean.py
    assert "1 file(s) without torch_xla or findings are not listed" in page
    items = [a for t, a in parser.tags if t == "tr" and a.get("class") == "manual"]
    assert len(items) == doc["migration"]["manual"]
    assert len([a for t, a in parser.tags if t == "details"]) == len([f for f in doc["files"] if f["manual"]])
    spmd = page[page.index("<summary>small/spmd.py</summary>"):]
    spmd = spmd[:spmd.index("</details>")]
    [item] = [m for f in doc["files"] if f["path"] == "small/spmd.py" for m in f["manual"]]
    assert item["code"] == "TPU172"
    assert f'<td>{item["line"]}</td><td><code>TPU172</code> spmd-sharding</td>' in spmd
    assert "DTensor" in spmd  # the replacement the TODO names


def test_text_from_files_is_escaped(checked):
    _, page, _ = checked
    assert "a&lt;b&amp;c&gt;.py" in page and ODD_NAME not in page
    assert "start &lt;workers&gt; &amp; join them by hand" in page and "<workers>" not in page
    parser = Collector()
    parser.feed(page)
    assert not {t for t, _ in parser.tags} - {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p",
                                               "table", "thead", "tbody", "tr", "th", "td", "code", "span",
                                               "details", "summary", "div", "br",
                                               "h3", "svg", "g", "rect", "text"}  # the charts


def test_self_contained(checked):
    _, page, _ = checked
    parser = Collector()
    parser.feed(page)
    for tag, attrs in parser.tags:
        assert "src" not in attrs and "href" not in attrs, (tag, attrs)
    assert "<script" not in page and "@import" not in page and "http" not in page


def test_the_cache_answers_the_same_report(checked):
    """The kept imports come from the workers; a warm run reads them from the cache."""
    project, page, doc = checked
    again = run_cli("rewrite", "--check", "-v", "--html", "again.html", "--format", "json",
                    "realistic", "corpus", "small", cwd=project)
    files = doc["migration"]["files"]
    assert f"{files} file(s), {files} from the cache".encode() in again.stderr
    assert json.loads(again.stdout)["migration"] == doc["migration"]
    assert (project / "again.html").read_text(encoding="utf-8") == page


@pytest.mark.slow
def test_a_write_run_reports_what_it_did(tmp_path):
    project = make_project(tmp_path)
    result = run_cli("rewrite", "--html", "report.html", "--format", "json", "realistic", "small", cwd=project)
    assert result.returncode == 1, result.stderr  # manual work remains
    migration = json.loads(result.stdout)["migration"]
    page = (project / "report.html").read_text(encoding="utf-8")
    assert migration["mode"] == "write" and migration["files_changed"] > 0
    assert _summary_cells(page)["fixes applied"] == str(migration["fixes"])
    # The written files import torch_xla as the report said: the blocked ones only what it names.
    for path in ("small/converts.py", "realistic/notebook_export.py"):
        assert "torch_xla" not in (project / path).read_text()
    spmd = (project / "small" / "spmd.py").read_text()
    assert "import torch_xla.distributed.spmd as xs" in spmd and "xla_model" not in spmd
    # A run on the written files names the same modules (at the lines of the new files).
    after = json.loads(run_cli("rewrite", "--check", "--format", "json", "realistic", "small", cwd=project).stdout)
    modules = {b["path"]: [i["module"] for i in b["imports"]] for b in migration["blocked"]}
    assert {b["path"]: [i["module"] for i in b["imports"]] for b in after["migration"]["blocked"]} == modules
    assert after["migration"]["fixes"] == 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium is not installed (apt-get install chromium)")
def test_opens_in_headless_chromium(checked, tmp_path):
    project, _, doc = checked
    report = project / "report.html"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(["chromium", *flags, "--dump-dom", f"file://{report}"],
                         capture_output=True, text=True, timeout=120)
    for table in ("summary", "families", "blocked", "files", "chart-families", "chart-files", "chart-before-after"):
        assert f'id="{table}"' in dom.stdout
    assert dom.stdout.count('class="blocked"') == doc["migration"]["blocked_files"]
    assert dom.stdout.count('class="manual"') == doc["migration"]["manual"]
    shot = tmp_path / "report.png"
    subprocess.run(["chromium", *flags, f"--screenshot={shot}", "--window-size=1000,900", f"file://{report}"],
                   capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
