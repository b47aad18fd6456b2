"""Wan's image-to-video conditioning (``families/wan/conditioning_i2v.py``) feeds the transformer what
``WanImageToVideoPipeline.__call__`` feeds it, for the three released layouts as tiny random pipelines:
Wan 2.1 I2V (36 channels and CLIP image states), Wan 2.2 I2V-A14B (two experts, no image encoder) and
Wan 2.2 TI2V-5B (48-channel VAE, the image latents as the first frame, per-token timesteps with zero
on that frame); and TI2V-5B's own folder (``WanPipeline`` with ``expand_timesteps``) trains text-to-video
as that pipeline calls its transformer.

For the same caption, image, noise and time, the pipeline's call is recorded with forward pre-hooks
(``pipeline_capture.capture``) at every denoising step, and the conditioning's ``encode_text`` /
``encode_images`` / ``constants`` / ``inputs`` on the same pipeline object give every keyword, in the
conditional branch and, for a dropped caption (the encoded empty prompt, the same image), in the
unconditional one; A14B's steps run the expert the conditioning's boundary names.

Run with -s to see the largest difference of each input."""

import numpy as np
import pytest
import torch

from opendit_lite.families import FAMILIES
from opendit_lite.families.tiny_pipelines import TINY_CALLS, build_tiny_pipeline
from tests.families.pipeline_capture import capture, difference

CAPTION = "a red square moving left"
IGNORED = {"attention_kwargs", "return_dict"}


def _picture(seed: int = 0):
    """A random 8-bit RGB picture of the tiny calls' size and the same picture as the data gives it:
    [3, H, W] in [-1, 1], computed as the pipeline's image processor normalises it."""
    import PIL.Image

    call = TINY_CALLS["wan_i2v"]
    pixels = np.random.RandomState(seed).randint(0, 256, (call["height"], call["width"], 3), dtype=np.uint8)
    tensor = torch.from_numpy(pixels.astype(np.float32) / 255.0).permute(2, 0, 1) * 2.0 - 1.0
    return PIL.Image.fromarray(pixels), tensor


def _pipeline(name: str):
    """The tiny pipeline ``name``; ``wan_ti2v_i2v``: the TI2V-5B folder loaded as WanImageToVideoPipeline,
    as its image-to-video runs (``expand_timesteps`` from the folder)."""
    if name != "wan_ti2v_i2v":
        return build_tiny_pipeline(name)
    from diffusers import WanImageToVideoPipeline

    pipe = build_tiny_pipeline("wan_ti2v")
    return WanImageToVideoPipeline(**pipe.components, expand_timesteps=pipe.config.expand_timesteps)


def _noise(pipe, call) -> torch.Tensor:
    frames = (call["num_frames"] - 1) // pipe.vae_scale_factor_temporal + 1
    side = call["height"] // pipe.vae_scale_factor_spatial
    return torch.randn(1, pipe.vae.config.z_dim, frames, side, side, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", ["wan_ti2v"])
def test_every_transformer_input_equals_the_pipelines(name):
    pipe = _pipeline(name)
    pipeline_class = type(pipe).__name__
    conditioning = FAMILIES["wan"].conditioning_of(pipeline_class)
    call = TINY_CALLS["wan_ti2v" if name == "wan_ti2v_i2v" else name]
    picture, image = _picture()
    noise = _noise(pipe, call)
    i2v = pipeline_class == "WanImageToVideoPipeline"
    stop = None if name == "wan22_i2v" else 0  # A14B: all three steps, to run both experts
    calls = capture(pipe, CAPTION, noise=noise, stop_after_step=stop, **call, **(dict(image=picture) if i2v else {}))

    with torch.no_grad():  # as the trainer's encoders run
        text, null = conditioning.encode_text(pipe, [CAPTION]), conditioning.encode_text(pipe, [""])
        images = conditioning.encode_images(pipe, [[image]], (call["num_frames"], call["height"], call["width"]))
    config = pipe.transformer.config
    constants = conditioning.constants(pipe, config, None)
    boundary = conditioning.expert_boundary(pipe)
    channels = pipe.vae.config.z_dim
    largest = {}
    for step in sorted({c.step for c in calls.calls}):
        component = calls.at(step)[0].component
        for dropped in (False, True):
            ref = calls.unconditional(step) if dropped else calls.conditional(step)
            t = ref["timestep"].reshape(-1).max().float()[None]       # TI2V: the first frame's tokens are at 0
            assert component == ("transformer" if boundary is None or t >= boundary else "transformer_2")
            x = ref["hidden_states"][:, :channels].clone()               # the noisy latents: 16 of 36 channels
            if constants["expand_timesteps"] and i2v:
                x[:, :, 0] = noise[:, :, 0]  # the pipeline's own noise there; the given image replaces it
            with torch.no_grad():
                mine = conditioning.inputs(config, constants, x, t, dict(null if dropped else text, **images))
            assert set(mine) == set(ref) - IGNORED, f"{sorted(mine)} vs {sorted(ref)}"
            for key in mine:
                largest[key] = max(largest.get(key, 0.0), difference(mine[key], ref[key]))
    print(f"\n{name} ({pipeline_class}): " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    assert all(v == 0.0 for v in largest.values()), largest
    if name == "wan22_i2v":
        assert {c.component for c in calls.calls} == {"transformer", "transformer_2"}
    assert (config.image_dim is not None) == ("encoder_hidden_states_image" in images) == (name == "wan_i2v")

    # The loss covers what the pipeline denoises: all but TI2V image-to-video's given first frame.
    mask = conditioning.loss_mask(config, constants, noise)
    if name == "wan_ti2v_i2v":
        assert mask.shape == (1, 1, noise.shape[2], 1, 1) and mask[:, :, 0].eq(0).all() and mask[:, :, 1:].eq(1).all()
    else:
        assert mask is None


def test_without_ftfy_image_to_video_cleans_prompts_as_the_text_to_video_pipeline():
    """diffusers 0.42.1's image-to-video module calls ftfy unchecked; without ftfy it cleans as WanPipeline's."""
    from diffusers.pipelines.wan import pipeline_wan, pipeline_wan_i2v
    from diffusers.utils import is_ftfy_available

    from opendit_lite.families.wan.conditioning_i2v import clean_prompts_without_ftfy

    clean_prompts_without_ftfy()
    text = "  a red &amp;amp; blue\n square  "
    assert pipeline_wan_i2v.prompt_clean(text) == pipeline_wan.prompt_clean(text) == "a red & blue square"
    assert (pipeline_wan_i2v.basic_clean is pipeline_wan.basic_clean) == (not is_ftfy_available())


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """A CSV of one 12-frame clip captioned CAPTION, with no image column: image-to-video takes its first
    frame as loaded. 32x32, the tiny calls' size: the frame stays 8-bit, as the picture a user gives."""
    from tests.pipeline_runs import write_clip, write_csv

    folder = tmp_path_factory.mktemp("i2v_clips")
    write_clip(folder / "clip.mp4", 12, 32, 32)
    return write_csv(folder, [("clip.mp4", CAPTION)], "clips.csv")


def _as_picture(image: torch.Tensor):
    """[3, H, W] in [-1, 1] read from 8-bit frames -> that 8-bit picture (what a user gives the pipeline)."""
    import PIL.Image

    pixels = ((image.permute(1, 2, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    return PIL.Image.fromarray(pixels)


@pytest.mark.parametrize("name", ["wan_i2v", "wan22_i2v", "wan_ti2v_as_i2v"])
def test_a_training_step_from_a_csv_feeds_what_the_pipeline_feeds(name, tiny_pipeline, clips, tmp_path):
    """Through the trainer's data (prepare_video_data: the clip's first frame, PipelineEncoders, the
    denoiser with caption dropout) and objective: every keyword equals the pipeline's call on that frame,
    both branches, every step (A14B: the expert of each step); TI2V's loss leaves the given frame out.
    ``wan_ti2v_as_i2v``: the TI2V-5B folder as released (a WanPipeline) trained with
    ``model.pipeline_class: WanImageToVideoPipeline``, against ``WanImageToVideoPipeline.from_pretrained``
    of that folder (as a user samples its image-to-video)."""
    from diffusers import DiffusionPipeline, WanImageToVideoPipeline

    from opendit_lite.builders.video import build_video_model
    from opendit_lite.data.video_csv import collate_conditioned
    from opendit_lite.diffusion.loss import objective_loss
    from opendit_lite.families.wan.conditioning_i2v import clean_prompts_without_ftfy
    from opendit_lite.models.experts import NoiseExperts
    from opendit_lite.training.video import prepare_video_data
    from tests.families.pipeline_capture import noise_at as _noise_at
    from tests.pipeline_runs import pipeline_config

    as_i2v = name == "wan_ti2v_as_i2v"
    folder, call = (tiny_pipeline("wan_ti2v"), TINY_CALLS["wan_ti2v"]) if as_i2v else (tiny_pipeline(name),
                                                                                      TINY_CALLS[name])
    extra = ["model.pipeline_class=WanImageToVideoPipeline"] if as_i2v else []
    cfg = pipeline_config(folder, clips, call, str(tmp_path), "model.class_dropout_prob=0.5", *extra)
    data = prepare_video_data(cfg, torch.device("cpu"))
    _, batch = collate_conditioned([(0, data.dataset[0])])
    x0, inputs = data.model_inputs(batch)                                  # [1, C, T, h, w], text and image inputs
    model = build_video_model(cfg)
    experts = dict(model.experts()) if isinstance(model, NoiseExperts) else {"transformer": model}
    denoiser = data.denoiser(model, model)
    clean_prompts_without_ftfy()
    pipe = (WanImageToVideoPipeline if as_i2v else DiffusionPipeline).from_pretrained(folder, local_files_only=True)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    calls = capture(pipe, CAPTION, noise=noise, image=_as_picture(batch[2][0][0]), **call)
    objective = data.objective(tuple(x0.shape))

    largest, ran_all = {}, set()
    for step in sorted({c.step for c in calls.calls}):
        for dropped in (False, True):
            ref = calls.unconditional(step) if dropped else calls.conditional(step)
            t = (ref["timestep"].reshape(-1).max().double() / 1000).float()[None]
            latents = ref["hidden_states"][:, :x0.shape[1]]
            seen, ran = {}, []

            def record(expert):
                def hook(module, args, kwargs):
                    seen.update(kwargs)
                    ran.append(expert)
                return hook

            hooks = [e.register_forward_pre_hook(record(n), with_kwargs=True) for n, e in experts.items()]
            try:
                kwargs = dict(inputs, drop=torch.tensor([dropped]))
                objective.training_losses(denoiser, x0, model_kwargs=kwargs, noise=_noise_at(objective, x0, latents, t),
                                          t=t)
            finally:
                for hook in hooks:
                    hook.remove()
            assert ran == [calls.at(step)[0].component]
            ran_all.update(ran)
            assert set(seen) - IGNORED == set(ref) - IGNORED, f"{sorted(seen)} vs {sorted(ref)}"
            for key in set(ref) - IGNORED:
                largest[key] = max(largest.get(key, 0.0), difference(seen[key], ref[key]))
    print(f"\n{name} from a CSV: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    for key, diff in largest.items():  # hidden_states: the noise solved for in fp32
        assert diff <= {"hidden_states": 1e-5}.get(key, 0.0), f"{key} differs by {diff}"
    assert ran_all == set(experts)

    # The objective's loss: the mean over the latents the pipeline denoises (TI2V: all but the first frame).
    torch.manual_seed(3)
    loss = objective_loss(objective, denoiser, x0, dict(inputs))
    torch.manual_seed(3)
    noise = torch.randn_like(x0)
    t = objective.sample_time(1, device=x0.device)
    error = (denoiser(objective.add_noise(x0, noise, t), t * 1000, **inputs) - (noise - x0)) ** 2
    kept = error[:, :, 1:] if as_i2v else error
    torch.testing.assert_close(loss, kept.mean(), rtol=1e-6, atol=0)
    assert as_i2v == (denoiser.loss_mask(x0) is not None)


@pytest.mark.parametrize("name", ["wan_i2v", "wan22_i2v"])
def test_lora_exports_load_into_the_image_to_video_pipeline_without_warnings(name, tiny_pipeline, tmp_path):
    """The adapters of each trained expert, written as a run exports them (``export_lora``: the family's
    LoRA format; A14B's second expert in transformer_2/), load with ``WanImageToVideoPipeline.load_lora_weights``
    with no warning from diffusers or peft and give the trained experts' outputs (Wan 2.1 I2V's image
    cross-attention projections, not trained, get zero adapters from diffusers' own expansion)."""
    import os

    from diffusers import WanImageToVideoPipeline

    from opendit_lite.interop import export_lora
    from opendit_lite.parallelization import parallelize
    from tests.diffusers_families import randomize_adapters
    from tests.video_scripts.test_lora_export import LoadLog

    folder = tiny_pipeline(name)
    trained = WanImageToVideoPipeline.from_pretrained(folder)
    experts = [c for c in ("transformer", "transformer_2") if getattr(trained, c) is not None]
    g = torch.Generator().manual_seed(0)
    config = trained.transformer.config
    inputs = dict(hidden_states=torch.randn(1, 36, 2, 4, 4, generator=g), timestep=torch.tensor([500.0]),
                  encoder_hidden_states=torch.randn(1, 8, config.text_dim, generator=g),
                  encoder_hidden_states_image=torch.randn(1, 17, config.image_dim, generator=g)
                  if config.image_dim else None, return_dict=False)
    out = str(tmp_path / "lora")
    untrained = {}
    for i, component in enumerate(experts):
        model = getattr(trained, component)
        with torch.no_grad():
            untrained[component] = model(**inputs)[0]
        parallelize(model, lora_rank=4, lora_alpha=8.0)
        randomize_adapters(model, seed=2 + i)
        export_lora(model.eval(), out if component == "transformer" else os.path.join(out, component))
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    with LoadLog() as log:
        pipe.load_lora_weights(out)
        if "transformer_2" in experts:
            pipe.load_lora_weights(os.path.join(out, "transformer_2"), load_into_transformer_2=True)
    assert not log.text(), log.text()
    with torch.no_grad():
        for component in experts:
            got, want = getattr(pipe, component)(**inputs)[0], getattr(trained, component)(**inputs)[0]
            assert (got - want).abs().max() < 1e-5, component
            assert (want - untrained[component]).abs().max() > 1e-4, component


def test_sampling_calls_the_image_to_video_pipeline_with_each_prompts_image(tiny_pipeline, clips, tmp_path):
    """sample.images reaches the pipeline's __call__ (its prompt by keyword: the image comes first in
    WanImageToVideoPipeline's signature): the sampled clip is the pipeline's own for that image and noise."""
    from diffusers import WanImageToVideoPipeline

    from opendit_lite.diffusion.sampling_utils import SampleGenerators
    from opendit_lite.sampling import sampling_ranks
    from opendit_lite.sampling.pipeline_sampling import pipeline_batches, pipeline_pixels
    from tests.pipeline_runs import pipeline_config, write_image

    folder, call = tiny_pipeline("wan22_i2v"), TINY_CALLS["wan22_i2v"]
    image = write_image(tmp_path / "first.png", call["height"], call["width"], seed=3)
    cfg = pipeline_config(folder, clips, call, str(tmp_path), f"sample.images=[{image}]", "sample.prompts=[" + CAPTION
                          + "]", "sample.num_sampling_steps=1", "sample.seed=5")
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    with sampling_ranks(1) as ranks:
        (indices, sampled), = list(pipeline_batches(pipe, cfg, [CAPTION], ranks))
    import PIL.Image

    with torch.no_grad():
        direct = pipe(image=PIL.Image.open(image).convert("RGB"), prompt=CAPTION, output_type="pt",
                      generator=SampleGenerators(5, range(1)).generators, **dict(call, num_inference_steps=1))
    assert list(indices) == [0] and torch.equal(sampled, pipeline_pixels(direct).float())


def test_outside_its_pipeline_an_image_to_video_transformer_is_planned_but_not_trained():
    """The family route (model.path: no pipeline, no images) refuses to train Wan 2.1 I2V's transformer;
    the planner's meta-device forwards get its condition channels and CLIP states as zeros of their shapes.
    An FLF2V transformer (first and last frame) gets its own conditioning (for_model), and the one-image
    conditioning refuses it."""
    from diffusers import WanTransformer3DModel

    from opendit_lite.errors import ConfigError
    from opendit_lite.families.wan.tiny import _WAN_TRANSFORMER

    config = dict(_WAN_TRANSFORMER, in_channels=36, out_channels=16, image_dim=16, added_kv_proj_dim=24)
    adapter = FAMILIES["wan"].adapter
    assert adapter.latent_channels(config) == 16
    with torch.device("meta"):
        model = WanTransformer3DModel(**config)
        x, states = torch.zeros(1, 16, 2, 4, 4), torch.zeros(1, 8, 32)
        assert adapter.forward(model, config, x, torch.ones(1), states, None, None).shape == x.shape
    with pytest.raises(ConfigError, match="image-to-video transformer: it trains on the images its pipeline"):
        adapter.forward(model, config, torch.zeros(1, 16, 2, 4, 4), torch.ones(1), torch.zeros(1, 8, 32), None, None)
    conditioning = FAMILIES["wan"].conditioning_of("WanImageToVideoPipeline")  # FLF2V: first and last frame
    from types import SimpleNamespace

    flf2v = dict(config, pos_embed_seq_len=34)
    assert conditioning.for_model(config) is conditioning and conditioning.for_model(flf2v).max_images == 2
    with torch.device("meta"):  # the planner's forward: both images' CLIP states, one row each
        model = WanTransformer3DModel(**flf2v)
        x = torch.zeros(1, 16, 2, 4, 4)
        assert adapter.forward(model, flf2v, x, torch.ones(1), torch.zeros(1, 8, 32), None, None).shape == x.shape
    pipe = SimpleNamespace(config={}, image_encoder=None)  # refused when the run's constants are read, before a step
    with pytest.raises(ValueError, match="does not feed this transformer"):
        conditioning.constants(pipe, flf2v, None)
    with pytest.raises(ConfigError, match="holds no image_encoder"):
        conditioning.constants(pipe, config, None)


def test_a_folder_loads_as_another_of_its_familys_pipelines_and_nothing_else(tiny_pipeline, tmp_path, capsys):
    """``model.pipeline_class``: the released TI2V-5B folder (a WanPipeline) loads as WanImageToVideoPipeline
    (its settings kept: expand_timesteps), that class's conditioning trains it; a class of no pipeline of
    the folder's family is refused with exit 2 naming the classes it takes, as is the key without
    model.pipeline and latents extracted for the folder's other class."""
    import json

    from opendit_lite.builders.pipeline import light_pipeline, pipeline_folder
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.data.video_latents import PIPELINE_FORMAT
    from opendit_lite.encoders.pipeline_folder import pipeline_fingerprint
    from opendit_lite.errors import ConfigError
    from opendit_lite.training.video import validate_video_config
    from tests.pipeline_runs import extract_script

    folder = tiny_pipeline("wan_ti2v")
    own, as_i2v = pipeline_folder(folder), pipeline_folder(folder, pipeline_class="WanImageToVideoPipeline")
    assert (own.pipeline_class, as_i2v.pipeline_class) == ("WanPipeline", "WanImageToVideoPipeline")
    assert as_i2v.conditioning is FAMILIES["wan"].conditioning_of("WanImageToVideoPipeline")
    assert pipeline_folder(folder, pipeline_class="WanPipeline") == own
    pipe = light_pipeline(folder, "WanImageToVideoPipeline")
    assert type(pipe).__name__ == "WanImageToVideoPipeline" and pipe.config.expand_timesteps
    with pytest.raises(ConfigError, match="one of that family's pipelines, WanPipeline, WanImageToVideoPipeline"):
        pipeline_folder(folder, pipeline_class="FluxKontextPipeline")
    with pytest.raises(ConfigError, match="model.pipeline is not set"):
        validate_video_config(load_config(None, ["model.pipeline_class=WanImageToVideoPipeline"],
                                          schema=VideoTrainConfig))
    from opendit_lite.sampling.pipeline_sampling import sample_images

    sampled = load_config(None, [f"model.pipeline={folder}", "model.pipeline_class=WanImageToVideoPipeline"],
                          schema=VideoTrainConfig)
    with pytest.raises(ConfigError, match="trained WanImageToVideoPipeline, which is conditioned on an image"):
        sample_images(sampled, 1)  # sampling loads the folder as the class the run trained
    latents = tmp_path / "latents"  # extracted from the folder as itself (text-to-video: no image inputs)
    latents.mkdir()
    (latents / "meta.json").write_text(json.dumps({"format": PIPELINE_FORMAT, "fingerprint": pipeline_fingerprint(
        folder), "pipeline_class": "WanPipeline", "pixel_sizes": [[5, 32, 32]]}))
    cfg = load_config(None, [f"model.pipeline={folder}", "model.pipeline_class=WanImageToVideoPipeline",
                             "data.type=latents", f"data.path={latents}"], schema=VideoTrainConfig)
    with pytest.raises(ConfigError, match="extracted for WanPipeline, but the run trains the folder as "
                                          "WanImageToVideoPipeline"):
        validate_video_config(cfg)
    csv = tmp_path / "clips.csv"
    csv.write_text("path,text\n")
    for argv in (["--pipeline-class", "WanImageToVideoPipeline", "--family", "wan"],
                 ["--pipeline", folder, "--pipeline-class", "QwenImageEditPipeline", "--csv", str(csv)]):
        with pytest.raises(SystemExit) as exit_info:
            extract_script().main(["--output", str(tmp_path / "out"), *argv])
        assert exit_info.value.code == 2
    assert "WanPipeline, WanImageToVideoPipeline" in capsys.readouterr().err
