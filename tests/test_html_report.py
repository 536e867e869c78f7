"""`diagnose --html`: a self-contained page with the findings and an inline-SVG timeline."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from conftest import ROOT
from test_diagnose import diagnosed, diagnosed_page

pytestmark = pytest.mark.slow  # a diagnose run and headless Chromium

PROGRAM = ROOT / "fixtures" / "diagnose" / "recompile_last_batch.py"


class Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


@pytest.fixture(scope="module")
def report():
    """The page of the session's shared `diagnose --format json --html` run of PROGRAM."""
    result = diagnosed(PROGRAM)
    assert result.returncode == 0, result.stderr[-2000:]
    return diagnosed_page(PROGRAM)


def test_structure(report):
    text = report.read_text()
    parser = Collector()
    parser.feed(text)
    tags = parser.tags
    rows = [a for t, a in tags if t == "tr" and a.get("class") == "finding"]
    assert len(rows) == 1 and "recompile_last_batch.py:16" in text
    steps = [a for t, a in tags if t == "rect" and a.get("class") == "step"]
    assert [int(a["data-step"]) for a in steps] == list(range(7))
    warmup = [a for t, a in tags if t == "rect" and a.get("class") == "warmup"]
    assert len(warmup) == 1 and float(warmup[0]["width"]) > 0  # 2 warm-up steps shaded
    compiles = [a for t, a in tags if t == "circle" and "compiles" in a.get("class", "")]
    assert len(compiles) == 2  # step 0 (warm-up) and the recompile in step 4
    # The costs: a reference line at the steady-state median, the recompile's step outlined as
    # slowed by it, the user's line beside the finding with the path relative to the directory.
    assert len([a for t, a in tags if t == "line" and a.get("class") == "steady"]) == 1
    assert [a["data-step"] for t, a in tags if t == "rect" and a.get("class") == "slowed"] == ["4"]
    assert "slowed by recompile at fixtures/diagnose/recompile_last_batch.py:16" in text
    assert '<code class="source">xm.mark_step()  # line 16' in text
    assert "steady state: median step" in text and "cost " in text


def test_self_contained(report):
    text = report.read_text()
    parser = Collector()
    parser.feed(text)
    for tag, attrs in parser.tags:
        for name in ("src", "href"):
            assert name not in attrs, (tag, attrs)
    assert "<script" not in text and "@import" not in text
    assert text.count("http") == text.count('xmlns="http://www.w3.org/2000/svg"')


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium is not installed (apt-get install chromium)")
def test_opens_in_headless_chromium(report, tmp_path):
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(["chromium", *flags, "--dump-dom", f"file://{report}"],
                         capture_output=True, text=True, timeout=120)
    assert 'id="findings"' in dom.stdout and 'id="timeline"' in dom.stdout
    assert dom.stdout.count('class="step"') == 7
    assert dom.stdout.count('class="steady"') == 1 and dom.stdout.count('class="slowed"') == 1
    shot = tmp_path / "report.png"
    subprocess.run(["chromium", *flags, f"--screenshot={shot}", "--window-size=1000,900", f"file://{report}"],
                   capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_a_long_run_is_drawn_as_at_most_max_bars():
    from tpu_migrate.diagnose import html
    from tpu_migrate.diagnose.analysis import StepRecord

    steps = [StepRecord(i, 0.01 if i % 2 else 0.03, syncs=1, compiles=int(i == 4321)) for i in range(5000)]
    page = html.render("train.py", steps, 2, [], 0, backend="native", total_steps=7000)
    parser = Collector()
    parser.feed(page)
    bars = [a for t, a in parser.tags if t == "rect" and a.get("class") == "step"]
    assert len(bars) == html.MAX_BARS
    assert [(int(a["data-step"]), int(a["data-last-step"])) for a in bars[:2]] == [(0, 4), (5, 9)]
    assert "steps 0-4: 20.0 ms a step" in page  # steps 1-4 (step 0 has no wall time)
    [compile_mark] = [a for t, a in parser.tags if t == "circle" and "compiles" in a.get("class", "")]
    assert "steps 4320-4324: 1 compile(s)" in page
    assert len([a for t, a in parser.tags if t == "circle" and "syncs" in a.get("class", "")]) == html.MAX_BARS
    assert "backend native &middot; 7000 steps &middot; the timeline shows the first 5000" in page


def test_markdown_code_spans_are_rendered_as_code():
    """Messages are written with Markdown backticks (`item`): the page shows them as <code>."""
    program = ROOT / "fixtures" / "diagnose" / "host_sync_item.py"
    result = diagnosed(program)
    assert result.returncode == 0, result.stderr[-2000:]
    text = diagnosed_page(program).read_text()
    table = text[text.index('<table id="findings">'):text.index("</table>")]
    assert "host sync <code>item</code> at" in table
    assert "`" not in table
