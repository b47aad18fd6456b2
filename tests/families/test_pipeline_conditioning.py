"""A training step of a run from a pipeline folder (``model.pipeline``, ``data.type: csv``) feeds the
transformer what the family's diffusers pipeline feeds it: for each of the seven released layouts
(tiny random pipelines, built once per test run), the pipeline is called on a caption with a fixed
noise and forward pre-hooks record every keyword of every transformer call; the trainer's data
encodes a captioned image or clip with the same caption, and its objective's training loss is taken at
the pipeline's time with the noise that puts the noisy latents where the pipeline's are. Every input
(text states with their padding and token count, pooled text, masks, ids, guidance, rotary tables, rope
scale, the timestep's scale) equals the pipeline's: conditional, and for a dropped caption its
unconditional branch (the encoded empty prompt). Wan 2.2's pipeline denoises each step with the expert
of its noise level; the training model (both experts as one ``NoiseExperts``) runs the same expert for
the same time, and a backward through the steps' losses trains both experts.

Run with -s to see the largest difference of each input."""

import pytest
import torch

from opendit_lite.builders.video import build_video_model
from opendit_lite.diffusion.rectified_flow import RectifiedFlow
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from opendit_lite.models.experts import NoiseExperts
from opendit_lite.training.video import prepare_video_data
from tests.families.pipeline_capture import IGNORED, capture, model_latents
from tests.families.pipeline_capture import difference as _difference
from tests.families.pipeline_capture import noise_at as _noise_at
from tests.pipeline_runs import pipeline_config, write_clip, write_csv, write_image

CAPTION = "a red square moving left"
# The pipelines whose defaults run no unconditional branch: called with true CFG and the empty negative prompt.
TRUE_CFG = {"flux": dict(true_cfg_scale=2.0, negative_prompt=""),
            "hunyuanvideo": dict(true_cfg_scale=2.0, negative_prompt="")}


@pytest.fixture(scope="module")
def captioned(tmp_path_factory):
    """(image CSV, clip CSV): one 40x48 image and one 12-frame clip captioned CAPTION."""
    folder = tmp_path_factory.mktemp("captioned")
    write_image(folder / "image.png", 40, 48)
    write_clip(folder / "clip.mp4", 12, 40, 48)
    return (write_csv(folder, [("image.png", CAPTION)], "images.csv"),
            write_csv(folder, [("clip.mp4", CAPTION)], "clips.csv"))


@pytest.mark.parametrize("name", ["wan", "wan22", "hunyuanvideo", "cogvideox", "ltx", "flux", "sd3"])
def test_a_training_step_feeds_the_transformer_what_its_pipeline_feeds_it(name, tiny_pipeline, captioned, tmp_path):
    from diffusers import DiffusionPipeline

    folder, call = tiny_pipeline(name), TINY_CALLS[name]
    cfg = pipeline_config(folder, captioned[0 if "num_frames" not in call else 1], call, str(tmp_path),
                          "model.class_dropout_prob=0.5")
    data = prepare_video_data(cfg, torch.device("cpu"))
    clip, caption = data.dataset[0]
    x0, text = data.model_inputs((clip[None], [caption]))                         # [1, C, T, h, w], {key: [1, ...]}
    model = build_video_model(cfg)  # Wan 2.2: both experts, routed by timestep (NoiseExperts)
    experts = dict(model.experts()) if isinstance(model, NoiseExperts) else {"transformer": model}
    assert set(experts) == {"transformer", "transformer_2"} if name == "wan22" else {"transformer"}
    denoiser = data.denoiser(model, model)
    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    calls = capture(pipe, CAPTION, noise=noise, **call, **TRUE_CFG.get(name, {}))
    objective = data.objective(tuple(x0.shape))

    largest, losses = {}, []
    for step in sorted({c.step for c in calls.calls}):
        component = calls.at(step)[0].component
        for dropped in (False, True):
            ref = calls.unconditional(step) if dropped else calls.conditional(step)
            timestep = ref["timestep"].reshape(-1)[:1].double()
            if name == "flux":  # FluxPipeline passes sigma; the objective's timestep is sigma x 1000
                timestep = timestep * 1000
            t = (timestep / 1000).float() if isinstance(objective, RectifiedFlow) else timestep.long()
            latents = model_latents(pipe, ref["hidden_states"], x0.shape)
            seen, ran = {}, []

            def record(expert_name):
                def hook(module, args, kwargs):
                    seen.update(kwargs)
                    ran.append(expert_name)
                return hook

            hooks = [expert.register_forward_pre_hook(record(expert_name), with_kwargs=True)
                     for expert_name, expert in experts.items()]
            try:
                kwargs = dict(text, drop=torch.tensor([dropped]))
                losses.append(objective.training_losses(denoiser, x0, model_kwargs=kwargs,
                                                        noise=_noise_at(objective, x0, latents, t), t=t)["loss"])
            finally:
                for hook in hooks:
                    hook.remove()
            assert ran == [component], f"step {step}: the pipeline ran {component}, the training model {ran}"
            assert set(seen) - IGNORED == set(ref) - IGNORED, f"{sorted(seen)} vs {sorted(ref)}"
            for key in sorted(set(ref) - IGNORED):
                diff = _difference(seen[key], ref[key])
                largest[key] = max(largest.get(key, 0.0), diff)
    print(f"\n{name} ({type(pipe).__name__}): " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    for key, diff in largest.items():
        tolerance = 1e-5 if key in ("hidden_states", "timestep") else 0.0  # the noise solved for in fp32
        assert diff <= tolerance * max(1.0, 1000.0 if key == "timestep" else 1.0), f"{name}: {key} differs by {diff}"
    torch.stack(losses).sum().backward()  # every expert the pipeline ran gets a (non-zero) gradient
    for expert_name, expert in experts.items():
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in expert.parameters()), expert_name


def test_wan_per_token_timesteps_as_its_pipeline_expands_them():
    """Wan 2.2 TI2V's ``expand_timesteps``: one timestep per token of the 2x2 patch grid, as WanPipeline
    builds it from its mask."""
    from opendit_lite.families import FAMILIES
    from opendit_lite.families.tiny_pipelines import build_tiny_pipeline

    pipe = build_tiny_pipeline("wan")
    pipe.register_to_config(expand_timesteps=True)
    noise = torch.randn(1, 16, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    calls = capture(pipe, CAPTION, noise=noise, stop_after_step=0, **TINY_CALLS["wan"])
    ref = calls.conditional(0)
    conditioning = FAMILIES["wan"].conditioning
    constants = conditioning.constants(pipe, pipe.transformer.config, None)
    mine = conditioning.inputs(pipe.transformer.config, constants, noise, ref["timestep"][:, 0].float(),
                               {"encoder_hidden_states": ref["encoder_hidden_states"]})
    assert ref["timestep"].shape == mine["timestep"].shape == (1, 2 * 4 * 4)
    assert torch.equal(mine["timestep"].double(), ref["timestep"].double())
