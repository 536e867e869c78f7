"""MkDocs hook: adds the pages made from data (tpu_migrate/report/docs_pages.py): one per rule,
the rule index and the kinds of diagnose finding, from this checkout's tables and fixtures."""

import sys
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout, not an install

from tpu_migrate.report.docs_pages import generated_pages  # noqa: E402
from tpu_migrate.rules import load_catalog  # noqa: E402


def on_files(files, config):
    for path, content in generated_pages(load_catalog()).items():
        files.append(File.generated(config, path, content=content))
    return files
