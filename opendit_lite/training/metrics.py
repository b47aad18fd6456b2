"""Rank-0 training telemetry: a progress bar (step, loss, samples/s, ETA), a JSONL metrics file and
TensorBoard events. Metrics are handed over as device tensors accumulated between log points, so
the loop syncs with the host only every ``log_every`` steps."""

import json
import os
import time
from typing import Dict, Optional

import torch
from tqdm import tqdm


class MetricsLogger:
    def __init__(self, run_dir: str, enabled: bool, tensorboard: bool = True):
        self.enabled = enabled
        self.last_time = time.perf_counter()
        self.last_step = 0
        self.bar: Optional[tqdm] = None
        self.jsonl = None
        self.tb = None
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        self.jsonl = open(os.path.join(run_dir, "metrics.jsonl"), "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
            except ImportError:  # tensorboard is optional
                self.tb = None

    def start(self, start_step: int, total_steps: int) -> None:
        """Open the progress bar at ``start_step`` (after a resume, the restored step)."""
        self.last_step, self.last_time = start_step, time.perf_counter()
        if self.enabled:
            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)

    def log(self, step: int, sums: Dict[str, torch.Tensor], count: int, samples_per_step: int, extra=None) -> Dict:
        """``sums``: metric totals over the ``count`` steps since the last call (device tensors)."""
        values = {k: (v / max(count, 1)).item() for k, v in sums.items()}  # the one host sync
        now = time.perf_counter()
        steps = step - self.last_step
        values["samples_per_sec"] = steps * samples_per_step / max(now - self.last_time, 1e-9)
        values.update(extra or {})
        self.last_time, self.last_step = now, step
        if self.enabled:
            record = {"step": step, **values, "time": time.time()}
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
            if self.tb is not None:
                for k, v in values.items():
                    self.tb.add_scalar(k, v, step)
            self.bar.set_postfix(loss=f"{values.get('loss', float('nan')):.4f}",
                                 samples_s=f"{values['samples_per_sec']:.1f}")
        return values

    def record(self, step: int, values: Dict[str, float]) -> None:
        """Scalars measured outside the step loop (e.g. evaluation metrics), to metrics.jsonl and TensorBoard."""
        if self.enabled:
            self.jsonl.write(json.dumps({"step": step, **values, "time": time.time()}) + "\n")
            self.jsonl.flush()
            if self.tb is not None:
                for k, v in values.items():
                    self.tb.add_scalar(k, v, step)

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def write(self, msg: str) -> None:
        if self.enabled:
            (self.bar.write if self.bar is not None else print)(msg)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
