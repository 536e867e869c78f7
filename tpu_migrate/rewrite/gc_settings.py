"""The garbage collector's settings for the rewrite and the project passes before it (a module of
its own: the project passes run where libcst, which paths.py imports, is never imported)."""

from __future__ import annotations

import gc
from contextlib import contextmanager

# Allocations between two young-generation collections (Python's default: 700).
YOUNG_COLLECTION_THRESHOLD = 50_000


@contextmanager
def fewer_collections():
    """Run with the cyclic garbage collector mostly idle, as mypy does.

    A rewrite allocates millions of short-lived objects (ast and libcst nodes) that reference
    counting frees: they form no cycles, yet every 700 allocations the collector scans the
    young ones and, more rarely, everything alive. Measured on 386 dense torch_xla files: 11%
    of a cold single-process run in collections, 1% with this (benchmarks/bench_rewrite.py).
    The objects made before the run (modules, the catalog) are frozen out of every scan."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
