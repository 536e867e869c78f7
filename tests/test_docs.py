"""The README is a short entry point and the reference is a documentation site built from the
repository (mkdocs.yml, docs/): it builds with every warning an error (a broken link or anchor
fails it), and its rule and finding pages are generated from the tables and fixtures."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from tpu_migrate.diagnose.kinds import CATALOG as KINDS
from tpu_migrate.report.docs_pages import generated_pages
from tpu_migrate.report.explain import example_diffs
from tpu_migrate.rules import load_catalog

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_its_links_lead_to_pages_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    links = [link for link in LINK.findall(readme) if "://" not in link]
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).is_file(), link
    # The two commands of the quick start, verbatim, and the one CI runs.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert f"\n{ci}\n" in readme
    assert "\npython3.11 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/tpu-migrate rewrite" in readme


def test_every_rule_and_finding_kind_has_a_generated_page_with_its_example():
    catalog = load_catalog()
    pages = generated_pages(catalog)
    for rule in catalog.rules:
        page = pages[f"rules/{rule.code}.md"]
        assert page.startswith(f"# {rule.code} {rule.name}\n") and rule.explanation in page
        for _, diff in example_diffs(rule):  # the rule's own fixture, as `explain` shows it
            assert diff.rstrip("\n") in page
        assert f"[{rule.code}]({rule.code}.md)" in pages["rules/index.md"]
    assert f"{len(catalog.rules)} rules" in pages["rules/index.md"]
    for kind in KINDS:
        assert f"\n## {kind.name}\n" in pages["diagnose-kinds.md"]



def test_the_family_table_gives_each_rule_to_its_table_once():
    """The index's family table is made from the `[family]` tables: expanding its code ranges over
    the catalog gives each family exactly the rules of its file."""
    catalog = load_catalog()
    index = generated_pages(catalog)["rules/index.md"]
    order = [rule.code for rule in catalog.rules]
    claimed = {}
    for family in catalog.families.values():
        row = next(line for line in index.splitlines() if f"(`rules/{family.name}.toml`)" in line)
        codes = []
        for part in row.split(" | ")[0].strip("| ").split(", "):
            first, _, last = part.partition("-")
            codes += order[order.index(first):order.index(last or first) + 1]
        claimed[family.name] = codes
        assert family.summary in row
    assert claimed == {name: [r.code for r in catalog.rules if r.family == name] for name in catalog.families}
    assert sorted(c for codes in claimed.values() for c in codes) == order

def _build(root, site):
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


@pytest.mark.slow
def test_the_site_builds_strict_and_a_broken_link_fails_it(tmp_path):
    site = tmp_path / "site"
    built = _build(ROOT, site)
    assert built.returncode == 0, built.stderr[-3000:]
    catalog = load_catalog()
    for rule in catalog.rules:
        assert (site / "rules" / rule.code / "index.html").is_file(), rule.code
    assert (site / "diagnose-kinds" / "index.html").is_file()
    assert "Migrating your repository" in (site / "migrating" / "index.html").read_text(encoding="utf-8")
    # The same tree with one link that leads nowhere: refused, naming it.
    copy = tmp_path / "copy"
    (copy / "fixtures").mkdir(parents=True)
    for name in ("mkdocs.yml", "README.md", "docs", "rules", "fixtures/rewrite", "tpu_migrate"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, copy / name)
    page = copy / "docs" / "limits.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the FAQ](faq.md).\n", encoding="utf-8")
    broken = _build(copy, tmp_path / "broken-site")
    assert broken.returncode != 0
    assert "faq.md" in broken.stderr
