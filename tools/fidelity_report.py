"""Per file, which static fidelity checks (tests/static_fidelity.py) a rewrite fails, for both
targets: a reviewer counts the real files whose meaning changed.

    python tools/fidelity_report.py                 # the public corpus (fixtures/corpus)
    python tools/fidelity_report.py --all           # also realistic, programs and examples
    python tools/fidelity_report.py -v FILES...     # these files, each problem listed

Checks: 1 `edited worker` (a launched function's body changed beyond its torch_xla
statements), 2 `altered manual call` (a call left manual is not in the output as written),
3 `unmarked torch_xla use` (a torch_xla binding left in the output used on an unmarked line,
or an import left stale). Exit status 1 when any file fails a check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from static_fidelity import CHECKS, inputs, rewrite, static_problems  # noqa: E402

TARGETS = ("tpu", "portable")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tools/fidelity_report.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="every fixture set, not only the corpus")
    parser.add_argument("-v", "--verbose", action="store_true", help="list each problem")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    files = args.files or [p for p in inputs() if args.all or p.parent.name == "corpus"]
    width = max([len(p.name) for p in files] + [4])
    short = {"edited worker": "1 worker", "altered manual call": "2 manual", "unmarked torch_xla use": "3 unmarked"}
    print(f"{'file':<{width}}  " + "  ".join(f"{short[c]:>10}" for c in CHECKS) + "  (problems, tpu/portable)")
    failing = {c: 0 for c in CHECKS}
    failing_files = 0
    details = []
    for path in files:
        data = path.read_bytes()
        counts = {c: [] for c in CHECKS}
        for target in TARGETS:
            output, result = rewrite(data, path.name, target)
            found = static_problems(data.decode("utf-8"), output.decode("utf-8"), result)
            for check in CHECKS:
                counts[check].append(len(found[check]))
                details += [f"{path.name} [{target}] {check}: {p}" for p in found[check]]
        bad = [c for c in CHECKS if any(counts[c])]
        failing_files += bool(bad)
        for c in bad:
            failing[c] += 1
        print(f"{path.name:<{width}}  " + "  ".join(f"{'/'.join(map(str, counts[c])):>10}" for c in CHECKS))
    print(f"\n{len(files)} file(s); {failing_files} fail a check; per check: "
          + ", ".join(f"{short[c]} {n}" for c, n in failing.items()))
    if args.verbose and details:
        print()
        print("\n".join(details))
    return 1 if failing_files else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
