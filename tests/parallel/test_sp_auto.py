"""``sp_mode: auto`` (``parallel.modes.decide_sp_mode``): the mode whose communication costs the least
time not hidden by compute, among those the heads and the model allow, with its reason; the planner
prints the same choice that ``parallelize_from_config`` makes on 2 gloo ranks."""

import dataclasses

import pytest
import torch.distributed as dist

from opendit_lite.builders.family import config_schema
from opendit_lite.config import from_dict, read_yaml
from opendit_lite.models import build_model
from opendit_lite.parallel import Links, SPWorkload, decide_sp_mode, sp_workload
from opendit_lite.plan import model_of_config, plan_config
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results

ATTENTION = ("ulysses", "ring", "usp")
WAN = SPWorkload("Wan-1.3B-like", tokens=21 * 30 * 52, hidden=1536, heads=(12,) * 30, layers=30)
STDIT = SPWorkload("STDiT-XL/2", tokens=256, hidden=1152, heads=(16,) * 28, layers=28, sequences=16, frames=16)


def heads_of(w: SPWorkload) -> dict:
    return {f"blocks.{i}.attn": h for i, h in enumerate(w.heads)}


def test_two_heads_at_sp_4_take_usp_or_ring_and_say_why():
    two = SPWorkload("2 heads", tokens=4096, hidden=128, heads=(2, 2), layers=2)
    choice = decide_sp_mode(heads_of(two), 4, ATTENTION, two)
    assert choice.mode in ("usp", "ring")
    assert choice.mode == "usp" and choice.ring_size == 2                    # Ulysses over the 2 heads, ring of 2
    assert "sp_size=4 does not divide the heads (2)" in choice.reason
    costs = choice.reason.split("compute: ")[1]
    assert not costs.startswith("ulysses") and "; ring " in costs          # Ulysses is not a candidate, ring is
    assert "ring " in choice.reason and "costs the least" in choice.reason
    no_usp = decide_sp_mode(heads_of(two), 4, ("ulysses", "ring"), two)         # a model without USP: the ring
    assert no_usp.mode == "ring" and no_usp.ring_size == 4


@pytest.mark.parametrize("sp", [2, 4])
def test_heads_divisible_inside_a_node_take_ulysses(sp):
    choice = decide_sp_mode(heads_of(WAN), sp, ATTENTION, WAN)
    assert choice.mode == "ulysses", choice.reason
    assert f"sp_size={sp} divides the heads (12)" in choice.reason and "inside one node" in choice.reason


def test_across_nodes_ulysses_inside_each_node_and_a_ring_between():
    two_nodes = Links(ranks_per_node=2)
    choice = decide_sp_mode(heads_of(WAN), 4, ATTENTION, WAN, two_nodes, spans_nodes=True)
    assert (choice.mode, choice.ring_size) == ("usp", 2), choice.reason
    assert "across nodes" in choice.reason


def test_dsp_capable_video_model_takes_dsp_where_it_moves_half():
    choice = decide_sp_mode(heads_of(STDIT), 8, ATTENTION + ("dsp",), STDIT)
    assert choice.mode == "dsp", choice.reason
    assert "dsp " in choice.reason and "ulysses " in choice.reason
    # The same model without its frames (an image) has nothing to switch: Ulysses.
    image = dataclasses.replace(STDIT, sequences=1, frames=0)
    assert decide_sp_mode(heads_of(image), 8, ATTENTION + ("dsp",), image).mode == "ulysses"


def test_without_a_sequence_length_the_heads_decide():
    assert decide_sp_mode({"a": 4}, 4, ATTENTION).mode == "ulysses"
    choice = decide_sp_mode({"a": 3}, 2, ATTENTION)
    assert choice.mode == "ring" and "sequence length unknown" in choice.reason


def test_workload_read_from_the_models_attention():
    stdit = sp_workload(build_model("STDiT-tiny"), frames=3, frame_tokens=15, text_tokens=8)
    assert (stdit.tokens, stdit.sequences, stdit.frames, stdit.hidden, stdit.text_tokens) == (15, 3, 3, 64, 0)
    vch = sp_workload(build_model("Vchitect-tiny"), frames=3, frame_tokens=15, text_tokens=8)
    assert (vch.sequences, vch.frames, vch.text_tokens, vch.text_query_layers) == (3, 0, 8, 1)
    dit = sp_workload(build_model("DiT-T/2", input_size=8, num_classes=10), frames=1, frame_tokens=16)
    assert (dit.tokens, dit.sequences, dit.heads, dit.layers) == (16, 1, (4, 4), 2)


# ------------------------------------------------------------------------ the run and the planner agree

CONFIGS = {"configs/demo.yaml": "ulysses", "configs/video_stdit_demo.yaml": "dsp",
           "configs/video_vchitect_demo.yaml": "ulysses", "configs/wan_tiny_demo.yaml": "ulysses"}


def _config(path):
    """The shipped config at sp_size=2, sp_mode=auto, built as the planner builds it (no data needed)."""
    tree = read_yaml(path)
    tree.update(sp_size=2, sp_mode="auto")
    return from_dict(config_schema(tree), tree)


def _run_side(rank, world_size):
    from opendit_lite.builders.parallelize import parallelize_from_config

    out = {}
    for path in CONFIGS:
        cfg = _config(path)
        model = model_of_config(cfg, device="cpu")
        report = parallelize_from_config(model, cfg, dist.group.WORLD)
        out[path] = str(report)
    return out


rank_checks("sp_auto", 2)(_run_side)


@pytest.mark.parametrize("path", list(CONFIGS))
def test_parallelize_auto_runs_what_the_planner_prints(path):
    cfg = _config(path)
    result, buckets, shape = plan_config(cfg, 80, 2, fixed=True)
    choice = result.sp_choice
    assert choice.describe(2) == CONFIGS[path], choice.reason
    table = result.table(buckets, shape)
    assert f"sp_mode={CONFIGS[path]}" in table and choice.reason in table
    report = " ".join(spawn_results("sp_auto", 2)[0][path].split())
    assert f"{choice.describe(2)} over 2 ranks" in report, report
    first, last = choice.reason.split(";")[0], choice.reason.rsplit(". ", 1)[1]   # the report wraps the rest
    assert first in report and last in report, report


def test_a_model_without_token_geometry_is_decided_by_its_heads():
    """A user's own model (LiteGen) with no ``patch_size``: auto decides from the heads alone."""
    import torch.nn as nn

    from opendit_lite.builders.geometry import sp_auto_inputs
    from opendit_lite.config import TrainConfig

    cfg = TrainConfig()
    assert sp_auto_inputs(nn.Linear(2, 2), cfg, 2, 8).workload is None
    dit = build_model("DiT-T/2", input_size=8, num_classes=10)
    cfg.model.name, cfg.model.input_size = "DiT-T/2", [8]
    inputs = sp_auto_inputs(dit, cfg, 16, 8)
    assert inputs.workload.tokens == 16 and inputs.spans_nodes and inputs.links.ranks_per_node == 8
