"""A compiled run's first step on CUDA runs eagerly, so that the fused kernels are timed against
torch.compile before the compiled graphs read the choices (``kernels/kernel_choice.py``); no other
step, and nothing off CUDA or when the choice is forced."""

import os

import pytest
import torch
import torch.distributed as dist

from opendit_lite.kernels import kernel_choice
from opendit_lite.training import loop


@pytest.mark.parametrize("compiled,device,mode,eager", [
    (True, "cuda", "measure", True), (False, "cuda", "measure", False), (True, "cpu", "measure", False),
    (True, "cuda", "fused", False), (True, "cuda", "compiled", False)])
def test_which_first_steps_run_eagerly(compiled, device, mode, eager, monkeypatch):
    monkeypatch.setenv(kernel_choice.ENV_MODE, mode)
    context = kernel_choice.first_step_context(compiled, torch.device(device))
    assert (getattr(context, "func", None) is kernel_choice.measured_eagerly.__wrapped__) == eager


def test_the_loop_measures_its_first_step_only(tmp_path, monkeypatch):
    """``run_steps`` of a compiled run asks for the measuring context at its first step only (a resumed
    run's first step in the process too: the choices are per process)."""
    from colossalai.booster import Booster

    from opendit_lite.config import TrainConfig
    from opendit_lite.optim.lr_schedule import build_lr_scheduler
    from opendit_lite.plugins import OpenDiTPlugin
    from opendit_lite.training.state import TrainState
    from opendit_lite.training.telemetry import MetricsLogger
    from tests.plugins.common import GLOBAL_BATCH, loss_fn, tiny_dit
    from tests.training.test_grad_accum import MicroBatches

    asked = []
    monkeypatch.setattr(loop, "first_step_context", lambda compiled, device: asked.append(compiled) or
                        kernel_choice.first_step_context(compiled, device))
    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        cfg = TrainConfig(exp_name="first", results_dir=str(tmp_path), max_steps=3, global_batch_size=GLOBAL_BATCH,
                          log_every=1, ckpt_every=0, logger=[], precision="fp32", grad_clip=0.0, compile=True)
        cfg.ema.enable = False
        plugin = OpenDiTPlugin(zero_degree=0, precision="fp32", grad_clip=0.0)
        booster = Booster(plugin=plugin)
        model = tiny_dit()
        optimizer = plugin.build_optimizer(model.parameters(), lr=1e-3)
        scheduler = build_lr_scheduler(optimizer, schedule="constant", warmup_steps=0, total_steps=3)
        model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
        log = MetricsLogger(os.path.join(str(tmp_path), "first"), enabled=True, loggers=[])
        state = TrainState(model, optimizer, scheduler, MicroBatches(0, 1))
        loop.run_steps(state, cfg, booster, log, batch_loss=lambda b, step: loss_fn(model, b),
                       device=torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    assert asked == [True, False, False]
