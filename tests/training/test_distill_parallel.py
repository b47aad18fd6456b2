"""Distillation (distill.teacher, DMD2) under ZeRO-1/2 and DDP at 2 ranks equals one process: LowLevelZero
buckets only the parameters whose gradient hook fired, so the network a step leaves out gets no (zero)
gradient and its Adam moments and step count stay put (checked on the optimizer's own state); a checkpoint
taken before the student's first step resumes bit-identically; the sharded EMA averages the student only.
These runs have the GAN term on (distill.gan_weight; its head steps with the critic). Sequence parallelism at
2 ranks gives one process's losses and gradients for both kinds of step, and so do block swapping and
activation checkpointing."""

import torch

from opendit_lite.builders.distill_model import CRITIC, STUDENT, DistillModule, GanHead, add_adapters
from opendit_lite.diffusion import build_scheduler
from opendit_lite.diffusion.sampling_utils import SampleGenerators
from opendit_lite.training.distill import distill_loss
from tests.distributed import run_distributed
from tests.training.test_distill import tiny_dit
from tests.training.test_distill_gan import cfg

STEPS, BATCH, LR, DECAY = 3, 4, 1e-2, 0.5  # critic_updates=1: critic, student, critic
GAN = 0.5  # distill.gan_weight where the GAN term is on (its head trains with the critic)


def lora_module(gan: bool = True) -> DistillModule:
    base = tiny_dit()
    add_adapters(base, (STUDENT, CRITIC), rank=2, alpha=2.0, dropout=0.0, targets=None)
    with torch.no_grad():  # both adapters away from their no-op start, so that both pass gradients
        for name, p in base.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.05)
    torch.manual_seed(3)
    return DistillModule(base, gan_head=GanHead(32) if gan else None)


def batch():
    g = torch.Generator().manual_seed(7)
    return torch.randn(BATCH, 3, 8, 8, generator=g), torch.randint(0, 4, (BATCH,), generator=g)


def loss_of(model, step: int, rows, gan: float = GAN) -> torch.Tensor:
    x, y = batch()
    return distill_loss(model, build_scheduler("rflow", num_timesteps=1000), cfg(gan), x[rows], dict(y=y[rows]),
                        SampleGenerators(0, list(rows), stream=(step,)), step)


def reference():
    """One process, plain AdamW over the whole batch, and an unsharded EMA (decay DECAY) of the student only."""
    module = lora_module()
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=LR, weight_decay=0.01)
    ema = {n: p.detach().clone() for n, p in module.named_parameters() if f".{STUDENT}." in n}
    for step in range(STEPS):
        loss_of(module, step, range(BATCH)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for n, p in module.named_parameters():
            if n in ema:
                ema[n].lerp_(p.detach(), 1 - DECAY)
    return {n: p.detach().clone() for n, p in module.named_parameters()}, ema


def _boosted_run(zero_degree: int, rows, first: int, folder: str):
    """Steps ``first``..STEPS-1 of a boosted run (resumed from ``folder`` unless ``first`` is 0; a fresh run
    saves there after its first step, when the student has no optimizer state yet). ZeRO-1 runs with the
    EMA updated inside the optimizer's step (fused_optimizer_ema)."""
    from colossalai.booster import Booster

    from opendit_lite.plugins import OpenDiTPlugin

    plugin = OpenDiTPlugin(zero_degree=zero_degree, precision="fp32", ddp_kwargs=dict(find_unused_parameters=True))
    booster = Booster(plugin=plugin)
    module = lora_module()
    optimizer = plugin.build_optimizer([p for p in module.parameters() if p.requires_grad], lr=LR, weight_decay=0.01,
                                       fused=False, fused_ema=zero_degree == 1)
    model, optimizer, *_ = booster.boost(module, optimizer)
    ema = plugin.create_ema(model, optimizer)
    if first:
        booster.load_model(model, f"{folder}/model")
        booster.load_optimizer(optimizer, f"{folder}/optimizer")
        ema.load_state_dict(torch.load(f"{folder}/ema.pt"))
    masters = optimizer.get_working_to_master_map() if zero_degree else {}

    def adam_steps(role):  # the Adam step counts of a network's parameters, the critic's head too (0: no state yet)
        states = [optimizer.optim.state.get(masters.get(id(p), p), {}) for n, p in module.named_parameters()
                  if p.requires_grad and module.trains_critic(n) == (role == CRITIC)]
        return {int(state.get("step", 0)) for state in states}

    steps = []
    for step in range(first, STEPS):
        booster.backward(loss_of(model, step, rows), optimizer)
        optimizer.step()
        optimizer.zero_grad()
        plugin.update_ema(model, optimizer, decay=DECAY)
        steps.append((adam_steps(CRITIC), adam_steps(STUDENT)))
        if step == 0:
            booster.save_model(model, f"{folder}/model", shard=True)
            booster.save_optimizer(optimizer, f"{folder}/optimizer", shard=True)
            state = ema.state_dict(only_rank_0=True)
            if torch.distributed.get_rank() == 0:
                torch.save(state, f"{folder}/ema.pt")
            torch.distributed.barrier()
    return dict(params={n: p.detach().clone() for n, p in module.named_parameters()}, ema=ema.state_dict(),
                steps=steps, ema_numel=ema.numel_local())


def _boosted(rank, world_size, folder):
    from tests.zero_cpu_shim import install as install_zero_cpu_shim

    install_zero_cpu_shim()
    half = BATCH // world_size
    rows = range(rank * half, (rank + 1) * half)
    out = {}
    for zero_degree in (0, 1, 2):
        out[zero_degree] = _boosted_run(zero_degree, rows, 0, f"{folder}/{zero_degree}")
        out[zero_degree]["resumed"] = _boosted_run(zero_degree, rows, 1, f"{folder}/{zero_degree}")
    return out


def test_distill_with_ddp_and_zero_equals_one_process_and_resumes_exactly(tmp_path):
    results = run_distributed(_boosted, world_size=2, args=(str(tmp_path),))
    params, ema = reference()
    student = sum(v.numel() for v in ema.values())
    for zero_degree, got in results[0].items():
        # each network's Adam state advances on its own steps only: critic, student, critic
        assert got["steps"] == [({1}, {0}), ({1}, {1}), ({2}, {1})], (zero_degree, got["steps"])
        diff = max((got["params"][k] - v).abs().max().item() for k, v in params.items())
        ema_diff = max((got["ema"][k] - v).abs().max().item() for k, v in ema.items())
        print(zero_degree, diff, ema_diff, got["ema_numel"], student)
        assert diff < 5e-5 and ema_diff < 5e-5, (zero_degree, diff, ema_diff)
        # the EMA averages the student only (half of it per rank, plus padding); the critic is saved as it is
        assert got["ema_numel"] <= student // 2 + 64, (zero_degree, got["ema_numel"], student)
        assert all(torch.equal(got["ema"][k], got["params"][k]) for k in params if f".{STUDENT}." not in k)
        resumed = got["resumed"]  # saved after the first step, when the student had no optimizer state
        assert resumed["steps"] == got["steps"][1:], (zero_degree, resumed["steps"])
        for part in ("params", "ema"):
            assert all(torch.equal(resumed[part][k], v) for k, v in got[part].items()), (zero_degree, part)


def _gradients(module, model, backward, rows, gan: float) -> list:
    """(loss, {name: gradient}) of a critic step (0) and a student step (1) from the same weights."""
    out = []
    for step in (0, 1):
        loss = loss_of(model, step, rows, gan)
        backward(loss)
        out.append((loss.item(), {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}))
        for p in module.parameters():
            p.grad = None
    return out


def _sequence_parallel(rank, world_size, sp_mode):
    from colossalai.booster import Booster

    from opendit_lite.parallelization import parallelize
    from opendit_lite.plugins import OpenDiTPlugin

    plugin = OpenDiTPlugin(zero_degree=0, sp_size=world_size, precision="fp32",
                           ddp_kwargs=dict(find_unused_parameters=True))
    booster = Booster(plugin=plugin)
    module = lora_module(gan=False)
    report = parallelize(module, sp_group=plugin.sp_group, sp_mode=sp_mode)
    optimizer = plugin.build_optimizer([p for p in module.parameters() if p.requires_grad], lr=LR, fused=False)
    model, optimizer, *_ = booster.boost(module, optimizer)
    return str(report), _gradients(module, model, lambda loss: booster.backward(loss, optimizer), range(BATCH), 0.0)


def test_distill_sequence_parallel_equals_one_process():
    module = lora_module(gan=False)  # the GAN head's pooled tokens are not split (refused with sp_size > 1)
    expected = _gradients(module, module, lambda loss: loss.backward(), range(BATCH), 0.0)
    report, got = run_distributed(_sequence_parallel, world_size=2, args=("ulysses",))[0]
    assert "UlyssesAttentionOp" in report, report
    for (loss, grads), (ref_loss, ref_grads) in zip(got, expected):
        assert grads.keys() == ref_grads.keys()
        diff = max((grads[k] - v).abs().max().item() for k, v in ref_grads.items())
        print("sp", abs(loss - ref_loss), diff)
        assert abs(loss - ref_loss) < 1e-6 and diff < 1e-6, (loss, ref_loss, diff)


def test_distill_with_block_swapping_and_checkpointing_equals_resident():
    """The LoRA base's blocks swapped (memory.blocks_to_swap) and checkpointed (selective_ratio=0): fetched
    at each of a step's passes (backward simulation, student, teacher, critic and its GAN head; forward then
    backward or recomputation), the losses and gradients are exact."""
    from opendit_lite.parallelization import parallelize

    for gan in (0.0, GAN):  # a recomputed block runs the adapter of the network its step trains
        module = lora_module(gan=bool(gan))
        expected = _gradients(module, module, lambda loss: loss.backward(), range(BATCH), gan)
        swapped = lora_module(gan=bool(gan))
        report = parallelize(swapped, blocks_to_swap=1, selective_ratio=0.0)
        assert report.swap is not None and len(report.swap.swapped) == 1 and report.checkpointing is not None
        got = _gradients(swapped, swapped, lambda loss: loss.backward(), range(BATCH), gan)
        for (loss, grads), (ref_loss, ref_grads) in zip(got, expected):
            assert loss == ref_loss and grads.keys() == ref_grads.keys()
            assert all(torch.equal(grads[k], v) for k, v in ref_grads.items()), gan
        assert report.swap.swapper.counts.stores == 0 and report.swap.swapper.counts.fetches > 4  # several passes
