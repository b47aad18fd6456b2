import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from zero_memory import ema_bytes, formula_rows, model_state_bytes  # noqa: E402


def test_formulas_reproduce_the_zero_paper_example():
    """ZeRO paper, Figure 1: 7.5B parameters on 64 GPUs with mixed-precision Adam (K = 12)."""
    psi, n = 7.5e9, 64
    assert model_state_bytes(1, psi, n) / 1e9 == pytest.approx(31.4, abs=0.05)
    assert model_state_bytes(2, psi, n) / 1e9 == pytest.approx(16.6, abs=0.05)
    assert model_state_bytes(3, psi, n) / 1e9 == pytest.approx(1.9, abs=0.05)
    assert ema_bytes(psi, n) == 4 * psi / n


def test_table_covers_every_degree_and_rank_count():
    rows = formula_rows(675_129_632, [1, 8, 64])
    assert {(r["zero_degree"], r["ranks"]) for r in rows} == {(z, n) for z in range(4) for n in (1, 8, 64)}
    by = {(r["zero_degree"], r["ranks"]): r["model_state_gib"] for r in rows}
    assert by[3, 64] < by[2, 64] < by[1, 64] < by[0, 64]
