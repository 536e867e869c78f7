"""pytest-xdist scheduling: each module of conftest.ONE_WORKER_MODULES goes to one worker whole,
and so does each group of conftest.ONE_WORKER_TESTS.

xdist's `--dist loadgroup` learns a test's group from an `@group` suffix that its worker-side
hook writes into the item's `_nodeid`; pytest 9.2 reads node ids from another field, so the
suffix never appears and loadgroup silently schedules test by test (pytest-xdist issue #1386).
A module whose tests share one module-scoped pool of runs then had its tests on both workers:
each worker started the whole pool, and one worker's teardown killed runs that the other's
tests were still waiting for. This scheduler takes the group from the test's node id instead
(its file, or the id itself), which every pytest version gives the same way.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from xdist.scheduler import LoadScopeScheduling


class Groups(LoadScopeScheduling):
    """Load scheduling test by test, except that the tests of each of `modules` (module names,
    `test_pod`) are one work unit, and the tests `tests` maps to one group name are another.
    `modules` may map a module to the group it joins (`{"test_verify_runs": "test_verify"}`:
    both modules' tests are one unit)."""

    def __init__(self, config, log, modules: set[str] | dict[str, str], tests: dict[str, str]):
        super().__init__(config, log)
        self.modules = modules if isinstance(modules, dict) else {module: module for module in modules}
        self.tests = tests

    def _split_scope(self, nodeid: str) -> str:
        if nodeid in self.tests:
            return self.tests[nodeid]
        module = PurePosixPath(nodeid.split("::", 1)[0]).stem
        return self.modules.get(module, nodeid)
