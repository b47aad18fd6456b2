"""A LoRA run of a released model's transformer (``model.pipeline``: a tiny Wan pipeline saved by the
test, trained on latents extracted from it) exports, by default,
``<run dir>/diffusers/pytorch_lora_weights.safetensors``, written by the pipeline's own
``save_lora_weights``, and ``comfyui_lora.safetensors`` (Wan's original names), alone (no copy of the
base); ``WanPipeline.load_lora_weights`` reads the first with no warning from diffusers or peft, the
second (``weight_name=``, diffusers' Wan converter) to the same pipeline output, and the EMA it
holds (warmed up as diffusers' EMAModel, the default for LoRA runs) carries most of what 60 steps
taught the adapters: the pipeline's output moves from the base's by at least half as much as with
the trained adapters themselves. An EMA decay whose horizon would erase a LoRA run is a one-line
warning with the share it keeps. A run with ``lora.init_from`` the ComfyUI file starts its adapters
from it."""

import io
import logging
import os
import re
import warnings

import pytest
import torch

from opendit_lite.families.tiny_pipelines import TINY_CALLS
from opendit_lite.interop.comfyui_lora import COMFYUI_WEIGHT_NAME
from tests.pipeline_runs import extracted_latents
from tests.video_scripts.test_family_scripts import main

PROMPT = "a red square moving right"


def wan_latents(pipeline: str, root, count: int = 4) -> str:
    """``count`` one-frame 16-pixel clips captioned PROMPT, extracted from ``pipeline`` (latents [16, 1, 4, 4])."""
    return extracted_latents(pipeline, root, [PROMPT] * count)


def lora_run_args(pipeline: str, data: str, results: str, steps: int):
    return [f"model.pipeline={pipeline}", "data.type=latents", f"data.path={data}", "precision=fp32",
            f"max_steps={steps}", "global_batch_size=2", "lr=5e-3", "log_every=20", "ckpt_every=0", "lora.rank=4",
            "lora.alpha=4", "exp_name=lora", f"results_dir={results}", "logger=[]"]


class LoadLog:
    """Warnings (``warnings.warn``) and WARNING records of diffusers' and peft's loggers while in use."""

    def __enter__(self):
        self.stream, self.loggers = io.StringIO(), [logging.getLogger(n) for n in ("diffusers", "peft")]
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setLevel(logging.WARNING)
        self.levels = [lg.level for lg in self.loggers]
        for lg in self.loggers:
            lg.addHandler(self.handler)
            lg.setLevel(logging.INFO)
        self.catcher = warnings.catch_warnings(record=True)
        self.warnings = self.catcher.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self.catcher.__exit__(*exc)
        for lg, level in zip(self.loggers, self.levels):
            lg.removeHandler(self.handler)
            lg.setLevel(level)

    def text(self) -> str:
        return self.stream.getvalue() + "".join(str(w.message) for w in self.warnings)

    def key_warnings(self) -> list:
        """The lines about missing or unexpected keys, or a transformer that found no LoRA keys. (Flux's
        and SD3's loaders also say that their text encoders found none, "safe to ignore", for every
        transformer-only LoRA: that line is theirs, not a mismatch.)"""
        return [line for line in self.text().splitlines() if "prefix='text_encoder" not in line
                and (re.search(r"unexpected|missing|incompatible", line, re.I) or "No LoRA keys" in line)]


def pipeline_output(pipeline: str, lora: str = None, weight_name: str = None) -> torch.Tensor:
    """The Wan pipeline's latents for PROMPT from fixed noise, with the LoRA folder ``lora`` loaded
    (its file ``weight_name``; None: the one diffusers picks)."""
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(pipeline)
    if lora is not None:
        with LoadLog() as log:
            pipe.load_lora_weights(lora, **({"weight_name": weight_name} if weight_name else {}))
        assert not log.text(), log.text()  # Wan's loader has no text encoder to report on: nothing at all
    noise = torch.randn(1, 16, 2, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return pipe(PROMPT, latents=noise, output_type="latent", **TINY_CALLS["wan"]).frames


@pytest.fixture(scope="module")
def lora_run(tiny_pipeline, tmp_path_factory):
    """60 LoRA steps on the tiny Wan pipeline's transformer, exported by default: (pipeline, run, latents)."""
    root = tmp_path_factory.mktemp("lora")
    pipeline = tiny_pipeline("wan")
    data = wan_latents(pipeline, root)
    main("train_video", lora_run_args(pipeline, data, str(root), 60))
    return pipeline, str(root / "lora"), data


def test_the_default_export_is_the_lora_files_alone_and_holds_most_of_what_was_learned(lora_run, tmp_path, capsys):
    """(And, in this test so that the run above is made once per test session whichever worker takes
    it:) ``lora.init_from`` its ComfyUI file starts every adapter of a new run from it: after 1 step of
    lr 5e-3 the adapters are within lr of the file's (AdamW's first step moves a weight by about lr at
    most), far from a fresh start (B = 0)."""
    from safetensors.torch import load_file

    from opendit_lite.checkpoint.layout import find_resume_checkpoint, saved_config
    from opendit_lite.checkpoint.weights import read_weights
    from opendit_lite.interop.family_checkpoint import export_family_checkpoint

    pipeline, run, data = lora_run
    out = os.path.join(run, "diffusers")
    # no base weights beside them; Wan has an original layout, so both formats by default
    assert sorted(os.listdir(out)) == [COMFYUI_WEIGHT_NAME, "pytorch_lora_weights.safetensors"]
    assert not os.path.exists(os.path.join(run, "merged.safetensors"))
    assert {os.stat(os.path.join(out, f)).st_mode & 0o777 for f in os.listdir(out)} == {0o644}
    # the trained adapters themselves (no EMA), exported the same way for the comparison
    ckpt = find_resume_checkpoint(os.path.join(run, "checkpoints"), "lora")
    saved = saved_config(ckpt)
    raw = export_family_checkpoint(saved["model"], saved["lora"], ckpt, os.path.join(run, "raw"), use_ema=False,
                                   lora_mode="adapter")
    base = pipeline_output(pipeline)
    exported, trained = pipeline_output(pipeline, out), pipeline_output(pipeline, raw)
    # WanPipeline.load_lora_weights reads the ComfyUI file (diffusers' Wan converter) to the same output
    comfy = pipeline_output(pipeline, out, weight_name=COMFYUI_WEIGHT_NAME)
    assert (comfy - exported).abs().max() < 1e-5 * exported.abs().max()
    ratio = ((exported - base).norm() / (trained - base).norm()).item()
    print(f"exported / trained change of the pipeline's output after 60 steps: {ratio:.3f}")
    assert (trained - base).norm() > 1e-3 * base.norm(), "the adapters learned nothing to compare"
    assert 0.5 <= ratio <= 1.1, ratio

    comfy = os.path.join(out, COMFYUI_WEIGHT_NAME)
    capsys.readouterr()
    main("train_video", [*lora_run_args(pipeline, data, str(tmp_path), 1), "export.diffusers=false",
                         f"lora.init_from={comfy}"])
    log = "".join(capsys.readouterr())
    assert re.search(r"lora.init_from: (\d+) of the model's \1 adapted layers", log), log
    started = read_weights(find_resume_checkpoint(os.path.join(tmp_path, "lora", "checkpoints"), "lora"), use_ema=False)
    up = load_file(comfy)["diffusion_model.blocks.0.self_attn.q.lora_up.weight"]     # the file's B of that layer
    b = started["blocks.0.attn1.to_q.lora_B.default.weight"]
    assert (b - up).abs().max() <= 5e-3 * 1.01 < 0.5 * up.abs().max(), "the run did not start from the file"


def test_a_long_ema_horizon_on_a_short_lora_run_is_one_warning(tiny_pipeline, tmp_path, capsys):
    data = wan_latents(tiny_pipeline("wan"), tmp_path)
    main("train_video", [*lora_run_args(tiny_pipeline("wan"), data, str(tmp_path), 2), "ema.warmup=false",
                         "export.diffusers=false"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "ema.decay" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: ema.decay 0.9999 over 2 steps keeps 0.0%"), err
    assert "ema.warmup=true" in lines[0]
