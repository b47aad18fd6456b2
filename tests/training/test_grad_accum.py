"""Gradient accumulation in the training loop: ``run_steps`` with k micro-batches per optimizer step
on 2 DDP ranks equals one process taking one step on the whole global batch (CPU, fp32)."""

import json
import os

import pytest
import torch

from tests.distributed import run_distributed
from tests.plugins.common import (
    GLOBAL_BATCH,
    LR,
    WEIGHT_DECAY,
    local_slice,
    loss_fn,
    make_batches,
    max_diff,
    reference_run,
    tiny_dit,
)

STEPS, ACCUM = 3, 2


class MicroBatches:
    """This rank's micro-batches of the shared global batches, in loop order (the loop reads
    ``epoch`` for its metrics and ``state_dict()`` only when it saves)."""

    def __init__(self, dp_rank: int, dp_size: int):
        self.epoch, self.batch_in_epoch = 0, 0
        self._it = (tuple(chunk[i] for chunk in chunks)
                    for batch in make_batches(STEPS)
                    for chunks in [[torch.chunk(t, ACCUM) for t in local_slice(batch, dp_rank, dp_size)]]
                    for i in range(ACCUM))

    def __next__(self):
        self.batch_in_epoch += 1
        return next(self._it)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, position: dict) -> None:
        raise AssertionError("this stream is not resumed")


def _train(rank, world_size, results_dir):
    from colossalai.booster import Booster

    from opendit_lite.config import TrainConfig
    from opendit_lite.optim.lr_schedule import build_lr_scheduler
    from opendit_lite.plugins import OpenDiTPlugin
    from opendit_lite.training.loop import run_steps
    from opendit_lite.training.state import TrainState
    from opendit_lite.training.telemetry import MetricsLogger

    cfg = TrainConfig(exp_name="accum", results_dir=results_dir, max_steps=STEPS, grad_accum_steps=ACCUM,
                      global_batch_size=GLOBAL_BATCH, log_every=1, logger=[], precision="fp32", grad_clip=0.0)
    cfg.ema.enable = False
    plugin = OpenDiTPlugin(zero_degree=0, precision="fp32", grad_clip=0.0)
    booster = Booster(plugin=plugin)
    model = tiny_dit()
    optimizer = plugin.build_optimizer(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    scheduler = build_lr_scheduler(optimizer, schedule="constant", warmup_steps=0, total_steps=STEPS)
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    log = MetricsLogger(os.path.join(results_dir, "accum"), enabled=rank == 0, loggers=[])
    state = TrainState(model, optimizer, scheduler, MicroBatches(plugin.dp_rank, plugin.dp_size))
    run_steps(state, cfg, booster, log, batch_loss=lambda b, step: loss_fn(model, b), device=torch.device("cpu"))
    assert state.step == STEPS
    return {n: p.detach().clone() for n, p in model.unwrap().named_parameters()}


@pytest.mark.slow
def test_accumulated_micro_batches_equal_one_big_batch(tmp_path):
    params = run_distributed(_train, world_size=2, args=(str(tmp_path),))
    reference, _ = reference_run(STEPS)
    assert max_diff(params[0], reference) < 2e-6
    assert max_diff(params[1], params[0]) == 0.0
    # The logged loss is the mean over the global batch, as the one-process loss would be.
    records = [json.loads(line) for line in open(tmp_path / "accum" / "metrics.jsonl")]
    model = tiny_dit()
    assert records[0]["loss"] == pytest.approx(loss_fn(model, make_batches(1)[0]).item(), rel=1e-5)
    assert [r["lr"] for r in records] == pytest.approx([LR] * STEPS)
