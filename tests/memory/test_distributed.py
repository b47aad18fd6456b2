"""Block swapping with sequence parallelism and with the booster's strategies (2 gloo ranks, one spawn).

* Ulysses over 2 ranks, LoRA, half the blocks checkpointed, both blocks swapped: the world mean of the
  adapters' gradients equals the serial model's on the global batch, and each rank fetched each
  block twice.
* DDP, ZeRO-1 and ZeRO-2 (LowLevelZero on the CPU through ``tests/zero_cpu_shim.py``), LoRA on an FP8
  base with every block swapped: after 3 steps every weight equals a single process without swapping
  (the booster's placement keeps the swapped tensors on the host; DDP ignores them).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from opendit_lite.activation_checkpointing import apply_activation_checkpointing
from opendit_lite.memory import apply_base_precision, apply_block_swap
from opendit_lite.models.lora import apply_lora
from tests.distributed import run_distributed
from tests.parallel.test_dit_sequence_parallel import batch, tiny_dit
from tests.plugins.common import LR, local_slice, loss_fn, make_batches, max_diff
from tests.training.test_lora import STEPS, TARGETS, pretrained_tiny_dit

INPUT = (10, 6)  # 15 tokens: padded by the SP split


def adapters_on(model):
    apply_lora(model, rank=4, alpha=8.0, dropout=0.0, targets=TARGETS)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    return model


def _sequence_parallel(rank, world_size):
    from opendit_lite.parallelization import apply_sequence_parallel

    serial = adapters_on(tiny_dit(INPUT))
    model = adapters_on(tiny_dit(INPUT))
    apply_sequence_parallel(model, sp_group=dist.group.WORLD, sp_mode="ulysses")
    report = apply_block_swap(model, 2)
    apply_activation_checkpointing(model, 0.5)
    x, t, y, target = batch(2, INPUT, seed=1)
    F.mse_loss(model(x, t, y), target).backward()
    F.mse_loss(serial(x, t, y), target).backward()
    errors = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            g = p.grad.clone()
            dist.all_reduce(g)
            errors.append((g / world_size - serial.get_submodule(name.rpartition(".")[0]).weight.grad)
                          .abs().max().item())
    return dict(error=max(errors), fetches=report.swapper.counts.fetches, checked=len(errors))


def reference_run():
    model = adapters_on(pretrained_tiny_dit())
    apply_base_precision(model, "fp8")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    for b in make_batches(STEPS):
        loss_fn(model, b).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _boosted(rank, world_size):
    from colossalai.booster import Booster

    from opendit_lite.plugins import OpenDiTPlugin
    from tests.zero_cpu_shim import install as install_zero_cpu_shim

    install_zero_cpu_shim()
    out = {"sp": _sequence_parallel(rank, world_size)}
    for zero_degree in (0, 1, 2):
        plugin = OpenDiTPlugin(zero_degree=zero_degree, precision="fp32")
        booster = Booster(plugin=plugin)
        model = adapters_on(pretrained_tiny_dit())
        apply_base_precision(model, "fp8")
        report = apply_block_swap(model, 2)
        optimizer = plugin.build_optimizer([p for p in model.parameters() if p.requires_grad], lr=LR)
        model, optimizer, *_ = booster.boost(model, optimizer)
        for b in make_batches(STEPS):
            booster.backward(loss_fn(model, local_slice(b, plugin.dp_rank, plugin.dp_size)), optimizer)
            optimizer.step()
            optimizer.zero_grad()
        hosts_kept = all(s.current().data_ptr() == s.host.data_ptr() for blk in report.swapper.blocks
                         for s in blk.slots)
        out[zero_degree] = dict(params={n: p.detach().clone() for n, p in model.unwrap().named_parameters()},
                                fetches=report.swapper.counts.fetches, hosts_kept=hosts_kept)
    return out


def test_swapping_with_sequence_parallelism_ddp_and_zero():
    results = run_distributed(_boosted, world_size=2)
    for rank_result in results:
        sp = rank_result["sp"]
        assert sp["error"] < 1e-5 and sp["checked"] > 0 and sp["fetches"] == 2 * 2, sp
    reference = reference_run()
    for zero_degree in (0, 1, 2):
        got = results[0][zero_degree]
        assert got["hosts_kept"] and got["fetches"] == 2 * 2 * STEPS, (zero_degree, got["fetches"])
        assert max_diff(got["params"], reference) < 2e-5, zero_degree
