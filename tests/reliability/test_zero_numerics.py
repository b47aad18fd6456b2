"""bf16 ZeRO-2 on 2 CPU ranks: a resumed run equals the uninterrupted one exactly (the fp32 master
shards travel with the checkpoint), and diffusion timesteps reach the embedder unrounded."""

import os

import pytest
import torch
import torch.distributed as dist

from opendit_lite.checkpoint.save_restore import load_checkpoint, save_checkpoint
from tests.checkpoint.test_state import run_on_cpu
from tests.zero_cpu_shim import install as install_zero_cpu_shim


def _setup():
    from colossalai.booster import Booster

    from opendit_lite.models import build_model
    from opendit_lite.plugins import OpenDiTPlugin

    install_zero_cpu_shim()
    plugin = OpenDiTPlugin(zero_degree=2, precision="bf16")
    torch.manual_seed(0)
    model = build_model("DiT-T/2", input_size=8, in_channels=3, num_classes=4, learn_sigma=False)
    optimizer = plugin.build_optimizer(model.parameters(), lr=1e-3, fused=False)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)
    return booster, model, optimizer


def _steps(parts, first, n):
    booster, model, optimizer = parts
    rank = dist.get_rank()
    for step in range(first + 1, first + n + 1):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(2, 3, 8, 8, generator=g), torch.randint(0, 4, (2,), generator=g)
        t, target = torch.rand(2, generator=g) * 1000, torch.randn(2, 3, 8, 8, generator=g)
        loss = (model(x, t, y).float() - target).pow(2).mean()  # not out^2: DiT's output layer starts at zero
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()


def _weights(model):
    return {k: v.detach().clone() for k, v in model.unwrap().state_dict().items()}


def _body(rank, world, root):
    a = _setup()
    _steps(a, 0, 4)
    reference = _weights(a[1])
    b = _setup()
    _steps(b, 0, 2)
    path = save_checkpoint(b[0], root, 2, b[1], b[2], exp_name="z")
    c = _setup()
    load_checkpoint(c[0], path, c[1], c[2], load_rng=False)
    _steps(c, 2, 2)
    resumed = _weights(c[1])
    same = {k: torch.equal(reference[k], resumed[k]) for k in reference}

    seen = []  # the timesteps as the embedder receives them
    c[1].unwrap().t_embedder.register_forward_pre_hook(lambda mod, args: seen.append(args[0].clone()))
    c[1](torch.randn(2, 3, 8, 8), torch.tensor([999.37, 1.5]), torch.tensor([0, 1]))
    return same, sorted(os.listdir(os.path.join(path, "master"))), seen[0]


@pytest.mark.slow
def test_bf16_zero2_resume_is_exact_and_timesteps_stay_fp32(tmp_path):
    for same, masters, t in run_on_cpu(_body, 2, (str(tmp_path),)):
        assert masters == ["rank00000.safetensors", "rank00001.safetensors"]
        assert all(same.values()), [k for k, ok in same.items() if not ok]
        assert t.dtype == torch.float32 and torch.equal(t, torch.tensor([999.37, 1.5]))
        assert torch.tensor(999.37).bfloat16().float() != 999.37  # what the bf16 input cast would give
