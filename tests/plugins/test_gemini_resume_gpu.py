"""Gemini (zero_degree 3) on one GPU, bf16: a run saved after 2 steps and resumed for 2 more equals 4
uninterrupted steps bit for bit (the fp32 master slices travel with the checkpoint, as ZeRO-1/2's
do), with the master chunks on the GPU and offloaded to the CPU; and fractional timesteps reach the
embedder in fp32, unrounded.

Bit-for-bit needs run-to-run determinism: the math attention kernel and deterministic algorithms
(warn-only: cuBLAS on one stream is deterministic without its workspace setting)."""

import os

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from opendit_lite.checkpoint.save_restore import load_checkpoint, save_checkpoint
from tests.plugins.common import loss_fn, make_batches, tiny_dit
from tests.plugins.test_plugin_gpu import nccl_world_of_one  # noqa: F401 (fixture)

pytestmark = pytest.mark.gpu

CONFIGS = {
    "gemini": {},
    # small chunks, sharded, with the fp32 masters and optimizer state in CPU memory
    "gemini_chunked_offload": dict(gemini_offload_optim_frac=1.0, gemini_kwargs=dict(min_chunk_size_m=0.01)),
}
TIME_OFFSET = 0.37  # fractional timesteps: bf16 would round 999.37 to 1000


@pytest.fixture
def deterministic():
    was = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    with sdpa_kernel(SDPBackend.MATH):
        yield
    torch.use_deterministic_algorithms(was[0], warn_only=was[1])


def _setup(kwargs):
    from colossalai.booster import Booster

    from opendit_lite.plugins import OpenDiTPlugin

    plugin = OpenDiTPlugin(zero_degree=3, precision="bf16", **kwargs)
    model = tiny_dit()
    optimizer = plugin.build_optimizer(model.parameters(), lr=1e-3, weight_decay=0.01)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)
    return booster, plugin, model, optimizer


def _steps(parts, batches, seen=None):
    booster, _, model, optimizer = parts
    for x, t, y, target in batches:
        t = t.float() + TIME_OFFSET
        if seen is not None:
            seen.append(t)
        loss = loss_fn(model, tuple(v.cuda() for v in (x, t, y, target)))
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()


def _masters(parts):
    _, plugin, model, optimizer = parts
    return {k: v.detach().cpu().clone() for k, v in plugin.master_weight_shards(model, optimizer).items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_bf16_resume_is_exact_and_timesteps_stay_fp32(nccl_world_of_one, deterministic, name, tmp_path):  # noqa: F811
    batches = make_batches(4)
    a = _setup(CONFIGS[name])
    _steps(a, batches)
    reference_masters = _masters(a)
    reference_weights = a[2].state_dict(only_rank_0=False)
    assert reference_masters and all(v.dtype == torch.float32 for v in reference_masters.values())

    b = _setup(CONFIGS[name])
    _steps(b, batches[:2])
    path = save_checkpoint(b[0], str(tmp_path), 2, b[2], b[3], exp_name="g")
    assert os.listdir(os.path.join(path, "master")) == ["rank00000.safetensors"]

    c = _setup(CONFIGS[name])
    load_checkpoint(c[0], path, c[2], c[3], load_rng=False)
    embedded = []  # the timesteps as the embedder receives them
    c[2].unwrap().t_embedder.register_forward_pre_hook(lambda mod, args: embedded.append(args[0].detach().cpu()))
    given = []
    _steps(c, batches[2:], given)

    resumed = _masters(c)
    assert resumed.keys() == reference_masters.keys()
    differ = [k for k in resumed if not torch.equal(resumed[k], reference_masters[k])]
    assert not differ, f"fp32 masters differ after the resume: {differ[:5]}"
    weights = c[2].state_dict(only_rank_0=False)
    assert all(torch.equal(weights[k], reference_weights[k]) for k in reference_weights)

    assert embedded[-1].dtype == torch.float32 and torch.equal(embedded[-1], given[-1])
    assert not torch.equal(given[-1].bfloat16().float(), given[-1])  # what Gemini's input cast would give
