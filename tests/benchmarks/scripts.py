"""The benchmark scripts (``benchmarks/<name>.py``) imported as modules, as the scripts import their
neighbours (``benchmarks/`` on ``sys.path``)."""

import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH_DIR = os.path.join(ROOT, "benchmarks")


def import_benchmark(name: str):
    """The module of ``benchmarks/<name>.py``."""
    if BENCH_DIR not in sys.path:
        sys.path.insert(0, BENCH_DIR)
    return importlib.import_module(name)
