"""The communication-volume table's formulas (benchmarks/sp_comm_volume.py) on hand-worked cases."""

import importlib.util
import os

import pytest

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "sp_comm_volume.py")
spec = importlib.util.spec_from_file_location("sp_comm_volume", PATH)
vol = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vol)

DIT_256, DIT_512, STDIT = vol.SHAPES


def test_shapes_are_the_model_zoo_token_counts():
    assert (DIT_256.tokens, DIT_512.tokens, STDIT.tokens) == (256, 1024, 16 * 256)


def test_ulysses_counts_four_all_to_alls_each_way():
    # 4 tensors of N*D/P elements per rank, (P-1)/P of each leaves the rank, forward and backward.
    n, d, p = 256, 1152, 8
    assert vol.ulysses_elements(DIT_256, p) == 2 * 4 * (n * d / p) * (p - 1) / p


@pytest.mark.parametrize("p", [8, 16])
def test_ulysses_moves_two_over_p_of_allgather(p):
    for shape in vol.SHAPES:
        assert vol.ulysses_elements(shape, p) / vol.allgather_kv_elements(shape, p) == pytest.approx(2 / p)


def test_applicability():
    assert vol.ulysses_elements(DIT_256, 64) is None          # 16 heads
    assert vol.dsp_elements(DIT_256, 8) is None               # one sequence axis
    assert vol.dsp_elements(STDIT, 64) is None                # 64 does not divide 16 frames
    assert vol.dsp_elements(STDIT, 16) == vol.ulysses_elements(STDIT, 16) / 2


def test_table_prints_every_shape_and_size():
    rows = vol.table(batch=1, bytes_per_element=2)
    assert len(rows) == 2 + len(vol.SHAPES) * len(vol.SP_SIZES)
    assert "| DiT-XL/2 256px | 256 | 8 | 504.0 KiB | 2.0 MiB | n/a | 0.250 |" in rows
