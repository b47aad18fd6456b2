"""benchmarks/sp_comm_volume.py: the table of bytes per layer and per step for the zoo's shapes, every
mode that can run at each SP size, and the auto choice; hand-worked cases of the formulas."""

import importlib.util
import os

import pytest

from opendit_lite.parallel.comm_volume import SPWorkload, layer_traffic, step_traffic
from opendit_lite.parallel.modes import Links

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "sp_comm_volume.py")
spec = importlib.util.spec_from_file_location("sp_comm_volume", PATH)
vol = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vol)

DIT = SPWorkload("DiT-XL/2 256px", tokens=256, hidden=1152, heads=(16,), layers=28)


def test_ulysses_counts_four_all_to_alls_each_way():
    # q, k, v and the output: 4 tensors of N D / P elements, (P-1)/P of each leaves the rank, forward and backward.
    n, d, p = 256, 1152, 8
    assert layer_traffic(DIT, "ulysses", p, element_bytes=1).total == 2 * 4 * (n * d / p) * (p - 1) / p


def test_ring_passes_k_v_each_step_and_the_fp32_gradient_accumulator():
    n, d, p, e = 256, 1152, 4, 2
    shard = n * d / p
    ring = layer_traffic(DIT, "ring", p, element_bytes=e)
    assert ring.all_to_all == 0 and ring.ring == 2 * 2 * (p - 1) * shard * e + 2 * p * shard * 4


def test_usp_is_ulysses_inside_and_a_ring_outside():
    usp = layer_traffic(DIT, "usp", 8, ring_size=2)
    assert usp.all_to_all == layer_traffic(DIT, "ulysses", 4).all_to_all / 2   # same shard S, (U-1)/U at U=4
    assert usp.ring == layer_traffic(SPWorkload("x", 64, 1152, (16,)), "ring", 2).ring       # same shard N/8


def test_dsp_moves_half_of_ulysses_when_the_axes_divide():
    stdit = SPWorkload("STDiT", tokens=256, hidden=1152, heads=(16,), sequences=16, frames=16)
    assert layer_traffic(stdit, "dsp", 8).total == layer_traffic(stdit, "ulysses", 8).total / 2


def test_step_adds_the_gather_and_text_free_last_layer():
    vch = SPWorkload("V", tokens=256, hidden=64, heads=(4,), layers=3, sequences=2, text_tokens=8, text_query_layers=2)
    step = step_traffic(vch, "ring", 2)
    with_text, without = layer_traffic(vch, "ring", 2), layer_traffic(vch, "ring", 2, text_queries=False)
    assert without.collective == 0 < with_text.collective
    assert step.total == pytest.approx(2 * with_text.total + without.total + 2 * 1 * 2 * 128 * 64 * 2)


def test_table_prints_every_shape_size_and_runnable_mode():
    rows = vol.rows(batch=1, element_bytes=2, links=Links())
    names = {w.name for w, _ in vol.SHAPES}
    assert {r["model"] for r in rows} == names and {r["sp_size"] for r in rows} == set(vol.SP_SIZES)
    wan = {(r["sp_size"], r["mode"]) for r in rows if r["model"].startswith("Wan")}
    assert (8, "ulysses") not in wan and (8, "usp r2") in wan and (8, "ring") in wan        # 12 heads
    stdit = [r for r in rows if r["model"].startswith("STDiT") and r["sp_size"] == 8]
    assert {r["auto_one_node"] for r in stdit} == {"dsp"}
    dit = next(r for r in rows if r["model"] == "DiT-XL/2 256px" and r["sp_size"] == 8 and r["mode"] == "ulysses")
    assert dit["layer_MiB"] == round(layer_traffic(DIT, "ulysses", 8).total / 2 ** 20, 3)


def test_docs_table_is_the_benchmarks():
    with open(os.path.join(os.path.dirname(PATH), "..", "docs", "sequence_parallel.md")) as f:
        doc = f.read()
    lines = vol.doc_table(vol.rows(batch=1, element_bytes=2, links=Links()))
    missing = [line for line in lines if line not in doc]
    assert not missing, "docs/sequence_parallel.md differs from benchmarks/sp_comm_volume.py: " + "; ".join(missing)
