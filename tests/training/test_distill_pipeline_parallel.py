"""A pipeline's distillation (``training/distill_pipeline.py``) on a tiny Wan transformer with the student and
critic adapters, under the zoo distillation's mechanisms: DDP, ZeRO-1 (EMA fused into the optimizer's step)
and ZeRO-2 at 2 ranks equal one process after a critic, a student and a critic step, each network's Adam
step count advancing on its own steps only, the sharded EMA averaging the student only; Ulysses over 2 ranks
gives one process's losses and gradients of a critic step and a student step, for the LoRA layout and for
full weights (each of the three transformers converted); block swapping
(``memory.blocks_to_swap``) gives them exactly. All in one 2-rank spawn plus one process."""

import copy
from types import SimpleNamespace

import pytest
import torch

from opendit_lite.builders.distill_model import CRITIC, ROLES, STUDENT, add_adapters
from opendit_lite.diffusion.sampling_utils import SampleGenerators
from opendit_lite.diffusion.scheduler_rollout import SchedulerRollout
from opendit_lite.training.distill_pipeline import (
    DistillDenoisers,
    PipelineDistillModule,
    RoleCall,
    pipeline_distill_loss,
)
from tests.distributed import run_distributed

STEPS, BATCH, LR, DECAY = 2, 2, 1e-2, 0.5  # 2 student steps; critic_updates=1: critic, student, critic
CFG = SimpleNamespace(distill=SimpleNamespace(student_timesteps=STEPS, guidance_scale=3.0, critic_updates=1),
                      global_seed=0)


def module(full: bool = False) -> PipelineDistillModule:
    """Wan's tiny transformer (2 blocks, 2 heads) with both adapters away from their no-op start; ``full``:
    three copies of it (teacher, student, critic) instead."""
    from opendit_lite.families.tiny_parts import random_transformer
    from opendit_lite.families.wan.tiny import _WAN_TRANSFORMER

    base = random_transformer("WanTransformer3DModel", 0, **_WAN_TRANSFORMER)
    if full:
        return PipelineDistillModule(base, copy.deepcopy(base), copy.deepcopy(base))
    add_adapters(base, (STUDENT, CRITIC), rank=2, alpha=2.0, dropout=0.0, targets=None)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.05)
    return PipelineDistillModule(base)


def loss_of(serial: PipelineDistillModule, call, step: int, rows) -> torch.Tensor:
    """Step ``step``'s loss of the batch's ``rows`` (latents [B, 16, 1, 4, 8]: 8 tokens), ``call``: the
    (boosted) module."""
    from diffusers import UniPCMultistepScheduler

    from opendit_lite.families import family_of_pipeline
    from opendit_lite.families.pipeline_denoiser import PipelineDenoiser

    rows = list(rows)
    family = family_of_pipeline("WanPipeline")
    c = family.conditioning_of("WanPipeline")
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    text = torch.randn(BATCH, 8, 32, generator=torch.Generator().manual_seed(1))[rows]  # 8 caption tokens
    null = {"encoder_hidden_states": torch.zeros(1, 8, 32)}
    config = serial.transformer.config
    denoisers = DistillDenoisers(
        {r: PipelineDenoiser(c, family.adapter, RoleCall(call, r), config, {"expand_timesteps": False}, null)
         for r in ROLES}, lambda shape: SchedulerRollout(scheduler, STEPS), serial)
    x = torch.zeros(len(rows), 16, 1, 4, 8)
    return pipeline_distill_loss(denoisers, SimpleNamespace(num_timesteps=1000), CFG, x,
                                 dict(encoder_hidden_states=text), SampleGenerators(0, rows, stream=(step,)), step)


def gradients(serial, call, backward, rows) -> list:
    """(loss, {name: gradient}) of a critic step (0) and a student step (1) from the same weights."""
    out = []
    for step in (0, 1):
        loss = loss_of(serial, call, step, rows)
        backward(loss)
        out.append((loss.item(), {n: p.grad.clone() for n, p in serial.named_parameters() if p.grad is not None}))
        for p in serial.parameters():
            p.grad = None
    return out


def reference():
    """One process, plain AdamW over the whole batch, an unsharded EMA (decay DECAY) of the student only."""
    serial = module()
    optimizer = torch.optim.AdamW([p for p in serial.parameters() if p.requires_grad], lr=LR, weight_decay=0.01)
    ema = {n: p.detach().clone() for n, p in serial.named_parameters() if f".{STUDENT}." in n}
    for step in range(3):
        loss_of(serial, serial, step, range(BATCH)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for n, p in serial.named_parameters():
            if n in ema:
                ema[n].lerp_(p.detach(), 1 - DECAY)
    return {n: p.detach().clone() for n, p in serial.named_parameters()}, ema


def _boosted_run(zero_degree: int, rows):
    from colossalai.booster import Booster

    from opendit_lite.plugins import OpenDiTPlugin

    plugin = OpenDiTPlugin(zero_degree=zero_degree, precision="fp32", ddp_kwargs=dict(find_unused_parameters=True))
    booster = Booster(plugin=plugin)
    serial = module()
    optimizer = plugin.build_optimizer([p for p in serial.parameters() if p.requires_grad], lr=LR, weight_decay=0.01,
                                       fused=False, fused_ema=zero_degree == 1)
    model, optimizer, *_ = booster.boost(serial, optimizer)
    ema = plugin.create_ema(model, optimizer)
    masters = optimizer.get_working_to_master_map() if zero_degree else {}

    def adam_steps(role):  # the Adam step counts of a network's parameters (0: no state yet)
        states = [optimizer.optim.state.get(masters.get(id(p), p), {}) for n, p in serial.named_parameters()
                  if p.requires_grad and (f".{CRITIC}." in n) == (role == CRITIC)]
        return {int(state.get("step", 0)) for state in states}

    steps = []
    for step in range(3):
        booster.backward(loss_of(serial, model, step, rows), optimizer)
        optimizer.step()
        optimizer.zero_grad()
        plugin.update_ema(model, optimizer, decay=DECAY)
        steps.append((adam_steps(CRITIC), adam_steps(STUDENT)))
    return dict(params={n: p.detach().clone() for n, p in serial.named_parameters()}, ema=ema.state_dict(),
                steps=steps, ema_numel=ema.numel_local())


def _ranks(rank, world_size):
    from colossalai.booster import Booster

    from opendit_lite.parallelization import parallelize
    from opendit_lite.plugins import OpenDiTPlugin
    from tests.zero_cpu_shim import install as install_zero_cpu_shim

    install_zero_cpu_shim()
    half = BATCH // world_size
    out = {degree: _boosted_run(degree, range(rank * half, (rank + 1) * half)) for degree in (0, 1, 2)}
    for full in (False, True):  # the LoRA layout (one base), full weights (three transformers, each converted)
        plugin = OpenDiTPlugin(zero_degree=0, sp_size=world_size, precision="fp32",
                               ddp_kwargs=dict(find_unused_parameters=True))
        booster = Booster(plugin=plugin)
        serial = module(full)
        report = parallelize(serial, sp_group=plugin.sp_group, sp_mode="ulysses")
        optimizer = plugin.build_optimizer([p for p in serial.parameters() if p.requires_grad], lr=LR, fused=False)
        model, optimizer, *_ = booster.boost(serial, optimizer)
        out["sp", full] = str(report), gradients(serial, model, lambda loss: booster.backward(loss, optimizer),
                                                 range(BATCH))
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return run_distributed(_ranks, world_size=2)[0]


def test_pipeline_distill_with_ddp_and_zero_equals_one_process(two_ranks):
    params, ema = reference()
    student = sum(v.numel() for v in ema.values())
    for zero_degree in (0, 1, 2):
        got = two_ranks[zero_degree]
        # each network's Adam state advances on its own steps only: critic, student, critic
        assert got["steps"] == [({1}, {0}), ({1}, {1}), ({2}, {1})], (zero_degree, got["steps"])
        diff = max((got["params"][k] - v).abs().max().item() for k, v in params.items())
        ema_diff = max((got["ema"][k] - v).abs().max().item() for k, v in ema.items())
        print(f"zero_degree={zero_degree}: parameters max |diff| {diff:.2e}, student EMA {ema_diff:.2e}")
        assert diff < 5e-5 and ema_diff < 5e-5, (zero_degree, diff, ema_diff)
        # the EMA averages the student only (half of it per rank, plus padding); the critic is saved as it is
        assert got["ema_numel"] <= student // 2 + 64, (zero_degree, got["ema_numel"], student)
        assert all(torch.equal(got["ema"][k], got["params"][k]) for k in params if f".{STUDENT}." not in k)


def test_pipeline_distill_sequence_parallel_and_block_swapping_equal_one_process(two_ranks):
    from opendit_lite.parallelization import parallelize

    for full in (False, True):
        serial = module(full)
        one = gradients(serial, serial, lambda loss: loss.backward(), range(BATCH))
        report, got = two_ranks["sp", full]
        networks = ("teacher", "student", "critic") if full else ("base",)
        assert all(f"{name}: ulysses" in report for name in networks), report
        for (loss, grads), (ref_loss, ref_grads) in zip(got, one):
            assert ref_grads and grads.keys() == ref_grads.keys()
            diff = max((grads[k] - v).abs().max().item() for k, v in ref_grads.items())
            print(f"ulysses sp_size=2 ({'full weights' if full else 'LoRA'}): loss |diff| {abs(loss - ref_loss):.2e}, "
                  f"gradients max |diff| {diff:.2e}")
            assert abs(loss - ref_loss) < 1e-6 and diff < 1e-6, (loss, ref_loss, diff)
        if not full:
            expected = one

    swapped = module()  # memory.blocks_to_swap=1 of the base's 2 blocks: fetched at every pass, exact
    report = parallelize(swapped, blocks_to_swap=1)
    assert report.swap is not None and len(report.swap.swapped) == 1
    for (loss, grads), (ref_loss, ref_grads) in zip(
            gradients(swapped, swapped, lambda loss: loss.backward(), range(BATCH)), expected):
        assert loss == ref_loss and grads.keys() == ref_grads.keys()
        assert all(torch.equal(grads[k], v) for k, v in ref_grads.items())
    assert report.swap.swapper.counts.fetches > 4  # rollout, student, teacher, critic passes
