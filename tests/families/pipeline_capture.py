"""What a diffusers pipeline feeds its transformer: run ``<Family>Pipeline.__call__`` for a caption
and a fixed noise with forward pre-hooks on ``transformer`` (and ``transformer_2``) that record every
keyword of every call, so that a test can compare a training step's transformer inputs with the
pipeline's.

    calls = capture(pipe, "a red square moving left", noise=noise, **TINY_CALLS[family])
    first = calls.conditional(step=0)        # the keywords of the conditional call at step 0

``noise`` is given as latent clips [B, C, T, h, w] (images: T = 1) and put into the pipeline's own
latent layout with its own helpers (Flux's, Qwen-Image's and LTX-Video's packing, CogVideoX's frame-major
order; Flux Kontext's and Qwen-Image-Edit's ``hidden_states`` are the target's tokens then the reference's);
at the first step of a flow pipeline (sigma 1) the transformer's ``hidden_states`` are that noise.
``model_latents`` maps a step's ``hidden_states`` back to latent clips.

Classifier-free guidance comes in two layouts: Wan and HunyuanVideo call the transformer twice per
step (the conditional call first), SD3, CogVideoX and LTX-Video once on a doubled batch (the
unconditional half first). ``conditional`` and ``unconditional`` undo both.

``tiny_pipeline_folder`` builds a family's tiny pipeline once under a shared root (the session
fixture ``tiny_pipeline`` in tests/conftest.py), safe under parallel test workers.
"""

import inspect
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

COMPONENTS = ("transformer", "transformer_2")
QWEN_IMAGE_PIPELINES = ("QwenImagePipeline", "QwenImageEditPipeline", "QwenImageEditPlusPipeline")


@dataclass
class TransformerCall:
    """One transformer forward: which component, in which denoising step, with which keywords
    (tensors cloned; tuples of tensors as tuples of clones)."""

    component: str
    step: int
    kwargs: Dict[str, Any]


@dataclass
class Capture:
    """Every transformer call of one pipeline run, in order; ``batch`` is the number of samples the
    pipeline was asked for (prompts x outputs per prompt)."""

    calls: List[TransformerCall] = field(default_factory=list)
    batch: int = 1

    def at(self, step: int, component: Optional[str] = None) -> List[TransformerCall]:
        return [c for c in self.calls if c.step == step and component in (None, c.component)]

    def conditional(self, step: int = 0) -> Dict[str, Any]:
        """The keywords of the conditional branch at ``step`` (batch ``batch``)."""
        return self._branch(step, conditional=True)

    def unconditional(self, step: int = 0) -> Dict[str, Any]:
        """The keywords of the unconditional (negative prompt) branch at ``step``."""
        return self._branch(step, conditional=False)

    def _branch(self, step: int, conditional: bool) -> Dict[str, Any]:
        calls = self.at(step)
        if not calls:
            raise KeyError(f"no transformer call at step {step}; steps run: {sorted({c.step for c in self.calls})}")
        if len(calls) == 2:  # two calls per step: conditional, then unconditional
            return calls[0 if conditional else 1].kwargs
        kwargs = calls[0].kwargs
        rows = kwargs["hidden_states"].shape[0]
        if rows == self.batch:
            if not conditional:
                raise KeyError(f"step {step} ran without guidance: there is no unconditional branch")
            return kwargs
        if rows != 2 * self.batch:
            raise ValueError(f"the transformer got a batch of {rows} for {self.batch} samples")
        half = slice(self.batch, None) if conditional else slice(0, self.batch)  # [unconditional, conditional]
        return {k: _rows(v, rows, half) for k, v in kwargs.items()}


def _rows(value, rows: int, half: slice):
    if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == rows:
        return value[half]
    return value


def _clone(value):
    if torch.is_tensor(value):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(v) for v in value)
    return value


def pipeline_latents(pipe, noise: torch.Tensor) -> torch.Tensor:
    """Latent clips [B, C, T, h, w] (images: T = 1) -> the ``latents`` argument of ``pipe.__call__``."""
    name = type(pipe).__name__
    if name in ("FluxPipeline", "FluxKontextPipeline"):
        image = noise[:, :, 0]                                                        # [B, C, h, w]
        return pipe._pack_latents(image, *image.shape)                                # [B, hw/4, 4C]
    if name in ("StableDiffusion3Pipeline", "ZImagePipeline"):
        return noise[:, :, 0]                                                         # [B, C, h, w]
    if name in QWEN_IMAGE_PIPELINES:
        image = noise[:, :, 0]                                                        # [B, C, h, w]
        return pipe._pack_latents(image, *image.shape)                                # [B, hw/4, 4C]
    if name == "Flux2Pipeline":
        return noise[:, :, 0]                                                         # [B, C, h, w]: it packs them
    if name == "LTXPipeline":
        return pipe._pack_latents(noise, pipe.transformer_spatial_patch_size,          # [B, N, C pt p p]
                                  pipe.transformer_temporal_patch_size)
    if name == "CogVideoXPipeline":
        return noise.transpose(1, 2)                                                  # [B, T, C, h, w]
    return noise                                                                      # [B, C, T, h, w]


def model_latents(pipe, latents: torch.Tensor, shape) -> torch.Tensor:
    """The inverse of ``pipeline_latents``: the pipeline's ``latents`` (its transformer's ``hidden_states``)
    -> latent clips of ``shape`` [B, C, T, h, w] (images: T = 1)."""
    name = type(pipe).__name__
    B, C, T, h, w = shape
    if name == "FluxKontextPipeline":  # the target's tokens, then the reference's
        latents = latents[:, : (h // 2) * (w // 2)]
    if name in ("FluxPipeline", "FluxKontextPipeline"):
        scale = pipe.vae_scale_factor
        return pipe._unpack_latents(latents, h * scale, w * scale, scale).unsqueeze(2)      # [B, C, 1, h, w]
    if name in ("StableDiffusion3Pipeline", "ZImagePipeline"):
        return latents.unsqueeze(2)
    if name in QWEN_IMAGE_PIPELINES:  # the edit pipelines append the reference tokens: the target's come first
        scale = pipe.vae_scale_factor
        return pipe._unpack_latents(latents[:, :(h // 2) * (w // 2)], h * scale, w * scale, scale)  # [B, C, 1, h, w]
    if name == "Flux2Pipeline":
        return latents.transpose(1, 2).reshape(B, C, 1, h, w)                         # [B, C, 1, h, w]
    if name == "LTXPipeline":
        return pipe._unpack_latents(latents, T, h, w, pipe.transformer_spatial_patch_size,
                                    pipe.transformer_temporal_patch_size)
    if name == "CogVideoXPipeline":
        return latents.transpose(1, 2)
    return latents


def capture(pipe, prompt, noise: Optional[torch.Tensor] = None, stop_after_step: Optional[int] = None,
            seed: int = 0, **call_kwargs) -> Capture:
    """Run ``pipe(prompt, ...)`` and record every transformer call. ``noise``: the initial latents as
    [B, C, T, h, w] (None: drawn from ``seed`` by the pipeline); ``stop_after_step``: skip the steps
    after it (the pipeline's interrupt flag); ``call_kwargs`` go to ``__call__`` (output_type
    defaults to "latent": no decoding)."""
    result = Capture(batch=len(prompt) if isinstance(prompt, list) else 1)
    state = {"step": 0}

    def hook(component):
        def record(module, args, kwargs):
            if args:
                raise AssertionError(f"{component} got positional arguments: the pipeline is expected to pass "
                                     f"keywords only")
            result.calls.append(TransformerCall(component, state["step"], _clone(kwargs)))
        return record

    def next_step(pipeline, step, timestep, tensors):
        state["step"] = step + 1
        if stop_after_step is not None and step >= stop_after_step:
            pipeline._interrupt = True
        return {}

    handles = [getattr(pipe, c).register_forward_pre_hook(hook(c), with_kwargs=True)
               for c in COMPONENTS if getattr(pipe, c, None) is not None]
    counted = "callback_on_step_end" not in inspect.signature(type(pipe).__call__).parameters
    if counted:  # a pipeline without a step callback (HunyuanVideo 1.5): a step ends with its scheduler's step
        scheduler_step = pipe.scheduler.step

        def step_then_count(*args, **kwargs):
            out = scheduler_step(*args, **kwargs)
            next_step(pipe, state["step"], None, None)
            return out

        pipe.scheduler.step = step_then_count
    else:
        call_kwargs["callback_on_step_end"] = next_step
    try:
        call_kwargs.setdefault("output_type", "latent")
        if noise is not None:
            call_kwargs["latents"] = pipeline_latents(pipe, noise)
        else:
            call_kwargs.setdefault("generator", torch.Generator().manual_seed(seed))
        with torch.no_grad():
            # the prompt by keyword: image-to-video and edit pipelines take the image first
            pipe(prompt=prompt, **call_kwargs)
    finally:
        for handle in handles:
            handle.remove()
        if counted:
            del pipe.scheduler.step
    return result


IGNORED = {"attention_kwargs", "joint_attention_kwargs", "return_dict"}  # keywords that carry no input


def noise_at(objective, x0: torch.Tensor, latents: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The noise whose noisy latents at time ``t`` under ``objective`` are ``latents``."""
    from opendit_lite.diffusion.rectified_flow import RectifiedFlow

    if isinstance(objective, RectifiedFlow):
        s = t.view(-1, 1, 1, 1, 1)
        return (latents - (1 - s) * x0) / s
    signal, sigma = objective._coefficients(t, x0)
    return (latents - signal * x0) / sigma


def difference(mine, ref) -> float:
    """The largest absolute difference of two inputs (tensors, tuples of tensors or plain values)."""
    if torch.is_tensor(ref):
        assert torch.is_tensor(mine) and mine.shape == ref.shape, f"{getattr(mine, 'shape', mine)} vs {ref.shape}"
        if ref.dtype == torch.bool:
            assert mine.dtype == torch.bool
        return (mine.double() - ref.double()).abs().max().item() if ref.numel() else 0.0
    if isinstance(ref, (tuple, list)):
        assert isinstance(mine, (tuple, list)) and len(mine) == len(ref)
        return max((difference(a, b) for a, b in zip(mine, ref)), default=0.0)
    assert mine == ref, f"{mine!r} vs {ref!r}"
    return 0.0


def training_step_inputs(model, objective, denoiser, x0: torch.Tensor, inputs: Dict[str, Any], latents: torch.Tensor,
                         t: torch.Tensor, dropped: bool):
    """(every keyword ``model`` receives, the loss [1]) in the training step of clean latents x0 whose noisy
    latents at time t [1] are ``latents`` (a pipeline's, so the step is comparable with its call), the
    caption ``dropped`` or not; ``inputs``: the data's per-sample inputs."""
    seen: Dict[str, Any] = {}
    hook = model.register_forward_pre_hook(lambda m, a, k: seen.update(k), with_kwargs=True)
    try:
        loss = objective.training_losses(denoiser, x0, model_kwargs=dict(inputs, drop=torch.tensor([dropped])),
                                         noise=noise_at(objective, x0, latents, t), t=t)["loss"]
    finally:
        hook.remove()
    return seen, loss


def record_differences(largest: Dict[str, float], seen: Dict[str, Any], ref: Dict[str, Any]) -> None:
    """Check ``seen`` has the keywords of ``ref`` (a pipeline's call) and keep each one's largest difference."""
    assert set(seen) - IGNORED == set(ref) - IGNORED, f"{sorted(seen)} vs {sorted(ref)}"
    for key in sorted(set(ref) - IGNORED):
        largest[key] = max(largest.get(key, 0.0), difference(seen[key], ref[key]))


def tiny_pipeline_folder(root, family: str) -> str:
    """The folder of ``family``'s tiny pipeline under ``root``, built and saved by the first caller
    (a file lock keeps parallel workers from building it twice; the folder appears complete)."""
    from filelock import FileLock

    from opendit_lite.families.tiny_pipelines import save_tiny_pipeline

    os.makedirs(root, exist_ok=True)
    folder = os.path.join(root, family)
    with FileLock(os.path.join(root, f"{family}.lock")):
        if not os.path.isfile(os.path.join(folder, "model_index.json")):
            partial = folder + ".partial"
            save_tiny_pipeline(family, partial, overwrite=True)
            shutil.rmtree(folder, ignore_errors=True)  # a folder left incomplete by an interrupted run
            os.replace(partial, folder)
    return folder
