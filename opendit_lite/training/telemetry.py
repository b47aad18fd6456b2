"""Rank-0 training telemetry: a progress bar (step, loss, samples/s, ETA), a JSONL metrics file and
the sinks listed in the ``logger`` field: TensorBoard events and/or a Weights & Biases run.

Every sink gets the same scalars at each log point: ``loss``, ``lr``, ``grad_norm`` (before
clipping, of the last step; when the strategy reports it), ``samples_per_sec``, ``tflops`` (per
rank) and ``mfu`` (on a GPU of known peak), ``mem_gib`` (peak accelerator memory since the last log
point on a GPU, the process's peak resident memory on the CPU) and ``epoch``. Metrics are handed
over as device tensors accumulated between log points, so the loop syncs with the host only every
``log_every`` steps.

W&B runs offline unless the environment sets ``WANDB_MODE`` (``wandb sync <run dir>/wandb/...``
uploads later); asking for it without the package installed is a ConfigError.
"""

import importlib.util
import json
import os
import resource
import sys
import time
from typing import Dict, Optional, Sequence

import torch
from tqdm import tqdm

from ..config import ConfigError


def check_loggers_available(loggers: Sequence[str]) -> None:
    """A ConfigError when a requested sink's package is missing (checked on every rank, so all stop)."""
    if "wandb" in loggers and importlib.util.find_spec("wandb") is None:
        raise ConfigError("logger lists wandb but the wandb package is not installed: `pip install wandb`, "
                          "or remove wandb from logger (TensorBoard and metrics.jsonl need nothing more).")


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory since the last call: the accelerator's allocated bytes on CUDA (the peak is
    reset), the process's peak resident set on the CPU (never reset; ru_maxrss is KiB on Linux)."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak / 2**30
    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**30


class MetricsLogger:
    def __init__(self, run_dir: str, enabled: bool, loggers: Sequence[str] = ("tensorboard",),
                 run_name: Optional[str] = None, config: Optional[dict] = None):
        """``loggers``: sinks besides metrics.jsonl ("tensorboard", "wandb"); ``run_name`` and
        ``config`` name and describe the W&B run."""
        check_loggers_available(loggers)
        self.enabled = enabled
        self.last_time = time.perf_counter()
        self.last_step = 0
        self.bar: Optional[tqdm] = None
        self.jsonl = None
        self.tb = None
        self.wandb = None
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        self.jsonl = open(os.path.join(run_dir, "metrics.jsonl"), "a")
        if "tensorboard" in loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
            except ImportError:
                print("warning: logger lists tensorboard but the tensorboard package is not installed; "
                      "metrics go to metrics.jsonl only", file=sys.stderr)
        if "wandb" in loggers:
            import wandb

            os.environ.setdefault("WANDB_MODE", "offline")  # nothing leaves the machine unless asked
            self.wandb = wandb.init(project="opendit_lite", name=run_name, dir=run_dir, config=config,
                                    resume="allow")

    def start(self, start_step: int, total_steps: int) -> None:
        """Open the progress bar at ``start_step`` (after a resume, the restored step)."""
        self.last_step, self.last_time = start_step, time.perf_counter()
        if self.enabled:
            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)

    def log(self, step: int, sums: Dict[str, torch.Tensor], count: int, samples_per_step: int, extra=None,
            flops_per_step: Optional[float] = None, peak_tflops: Optional[float] = None) -> Dict:
        """``sums``: metric totals over the ``count`` steps since the last call (device tensors);
        ``flops_per_step``: this rank's FLOPs per optimizer step, for ``tflops`` and, with the
        device's ``peak_tflops``, ``mfu``."""
        values = {k: (v / max(count, 1)).item() for k, v in sums.items()}  # the one host sync
        now = time.perf_counter()
        steps = step - self.last_step
        steps_per_sec = steps / max(now - self.last_time, 1e-9)
        values["samples_per_sec"] = steps_per_sec * samples_per_step
        if flops_per_step:
            values["tflops"] = flops_per_step * steps_per_sec / 1e12
            if peak_tflops:
                values["mfu"] = values["tflops"] / peak_tflops
        values.update({k: v for k, v in (extra or {}).items() if v is not None})
        self.last_time, self.last_step = now, step
        if self.enabled:
            record = {"step": step, **values, "time": time.time()}
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
            if self.tb is not None:
                for k, v in values.items():
                    self.tb.add_scalar(k, v, step)
            if self.wandb is not None:
                self.wandb.log(values, step=step)
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

    def images(self, step: int, name: str, paths) -> None:
        """Sample files written at ``step`` (images, videos, a contact sheet last) to TensorBoard (the
        contact sheet, as an image) and W&B (every image, and the videos)."""
        if not self.enabled or (self.tb is None and self.wandb is None):
            return
        import numpy as np
        from PIL import Image

        pictures = [p for p in paths if p.lower().endswith((".png", ".jpg", ".jpeg"))]
        if self.tb is not None and pictures:
            with Image.open(pictures[-1]) as im:
                self.tb.add_image(name, np.asarray(im.convert("RGB")), step, dataformats="HWC")
            self.tb.flush()
        if self.wandb is not None:
            import wandb

            media = [wandb.Image(p, caption=os.path.basename(p)) for p in pictures]
            videos = [p for p in paths if p.lower().endswith((".mp4", ".gif"))]
            media += [wandb.Video(p, caption=os.path.basename(p)) for p in videos]
            self.wandb.log({name: media}, step=step)

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
        if self.wandb is not None:
            self.wandb.finish()
