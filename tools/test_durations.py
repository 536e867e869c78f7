"""Write tests/durations.json from a pytest JUnit XML report: each test's seconds (those over
one second), which tests/conftest.py uses to start the longest tests first on the xdist workers.

    .venv/bin/python -m pytest --junitxml=/tmp/suite.xml && .venv/bin/python tools/test_durations.py /tmp/suite.xml

Refresh it when the slowest tests change (every run lists the 15 slowest); a test missing from
it is scheduled by its lane alone, so a stale file costs time, never correctness.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "durations.json"


def durations(report: Path) -> dict[str, float]:
    found = {}
    for case in ET.parse(report).iter("testcase"):
        seconds = float(case.get("time") or 0)
        if seconds >= 1.0:
            node = case.get("classname").replace(".", "/") + ".py::" + case.get("name")
            found[node] = round(seconds, 1)
    return dict(sorted(found.items()))


if __name__ == "__main__":
    OUT.write_text(json.dumps(durations(Path(sys.argv[1])), indent=0) + "\n")
    print(f"{OUT}: {len(json.loads(OUT.read_text()))} tests")
