"""A LoRA run on the tiny Z-Image pipeline (``model.pipeline``, captioned images, train_video.py, 2 steps)
exports adapters that ``ZImagePipeline.load_lora_weights`` loads with no key warnings, and sample.py
samples it through the pipeline: its images equal, within 1e-5 in fp32, the pipeline called directly
with the export loaded and the same generators (classifier-free guidance at the pipeline's default
scale). A Turbo folder samples at guidance 0 and refuses another ``sample.cfg_scale``. A full fine-tune
exports a pipeline folder ``ZImagePipeline.from_pretrained`` loads with the trained transformer."""

import os

import pytest
import torch

from opendit_lite.families.tiny_pipelines import TINY_CALLS
from tests.pipeline_runs import write_csv, write_image
from tests.video_scripts.test_family_scripts import main
from tests.video_scripts.test_lora_export import LoadLog
from tests.video_scripts.test_pipeline_sampling import PROMPTS, _max_diff, direct, script_clips


def test_a_z_image_lora_run_samples_through_its_pipeline_with_the_exported_lora(tiny_pipeline, tmp_path):
    from diffusers import ZImagePipeline

    folder, call = tiny_pipeline("z_image"), dict(TINY_CALLS["z_image"])
    steps, size = call.pop("num_inference_steps"), call["height"]
    media = write_image(tmp_path / "0.png", size, size)
    args = [f"model.pipeline={folder}", "data.type=csv", f"data.path={write_csv(tmp_path, [(media, PROMPTS[0])])}",
            f"data.image_size={size}", "data.frame_interval=1", "precision=fp32", "global_batch_size=1", "lr=5e-3",
            "ckpt_every=0", "lora.rank=4", "lora.alpha=4", "exp_name=lora", f"results_dir={tmp_path}", "logger=[]",
            "model.class_dropout_prob=0.5"]
    main("train_video", [*args, "max_steps=2"])
    sampling = [*args, f"sample.prompts={PROMPTS[:2]}", f"sample.num_sampling_steps={steps}"]
    ours = script_clips("sample", sampling)

    pipe = ZImagePipeline.from_pretrained(folder)
    base = direct(pipe, PROMPTS[:2], num_inference_steps=steps, **call)
    with LoadLog() as log:
        pipe.load_lora_weights(os.path.join(str(tmp_path), "lora", "diffusers"))
    assert not log.key_warnings(), log.text()
    reference = direct(pipe, PROMPTS[:2], num_inference_steps=steps, **call)
    assert ours.shape == (2, 3, 1, size, size) and torch.isfinite(ours).all()
    assert _max_diff(ours, reference) <= 1e-5, _max_diff(ours, reference)
    assert _max_diff(reference, base) > 1e-5  # the LoRA changes the samples


def test_a_turbo_folder_samples_without_guidance_and_refuses_a_cfg_scale(tiny_pipeline, tmp_path):
    """Z-Image-Turbo's folder (declared by model.guidance_distilled, else recognised by its release's folder
    name: the configs are the base model's) is sampled at guidance 0, ZImagePipeline's scale without an
    unconditional branch; a sample.cfg_scale it would not use is a ConfigError (exit code 2 from the
    scripts), the base folder's is taken."""
    from opendit_lite.config import ConfigError, load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.sampling.pipeline_sampling import check_pipeline_sampling, pipeline_call_settings

    base = tiny_pipeline("z_image")
    turbo = tmp_path / "Z-Image-Turbo"
    os.symlink(base, turbo)  # the same files under the release's folder name

    csv = write_csv(tmp_path, [("0.png", "a red square")])

    def config(folder, *extra):
        return load_config(None, [f"model.pipeline={folder}", "data.type=csv", f"data.path={csv}",
                                  "data.image_size=32", *extra], schema=VideoTrainConfig)

    assert pipeline_call_settings(config(turbo))["guidance_scale"] == 0.0
    assert "guidance_scale" not in pipeline_call_settings(config(base))        # the pipeline's own default, 5
    check_pipeline_sampling(config(turbo, "sample.cfg_scale=0"), None, None)
    check_pipeline_sampling(config(base, "sample.cfg_scale=4"), None, None)
    with pytest.raises(ConfigError) as refused:
        check_pipeline_sampling(config(turbo, "sample.cfg_scale=4"), None, None)
    message = str(refused.value)
    assert "sample.cfg_scale=4" in message and "Z-Image-Turbo is distilled from classifier-free guidance" in message
    assert "remove sample.cfg_scale" in message and "\n" not in message

    # Declared rather than named: model.guidance_distilled decides over the folder's name, either way.
    declared = config(base, "model.guidance_distilled=true")
    assert pipeline_call_settings(declared)["guidance_scale"] == 0.0
    with pytest.raises(ConfigError, match="model.guidance_distilled is true"):
        check_pipeline_sampling(config(base, "model.guidance_distilled=true", "sample.cfg_scale=4"), None, None)
    assert "guidance_scale" not in pipeline_call_settings(config(turbo, "model.guidance_distilled=false"))
    check_pipeline_sampling(config(turbo, "model.guidance_distilled=false", "sample.cfg_scale=4"), None, None)


def test_guidance_distilled_is_refused_where_it_cannot_apply(tiny_pipeline, tmp_path):
    """On a model that embeds its guidance value (FLUX.1 dev: model.guidance sets it) and without a pipeline
    folder, model.guidance_distilled is a ConfigError, not ignored."""
    from opendit_lite.builders.pipeline import resolve_pipeline
    from opendit_lite.config import ConfigError, load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.training.video import validate_video_config

    csv = write_csv(tmp_path, [("0.png", "a red square")])
    cfg = load_config(None, [f"model.pipeline={tiny_pipeline('flux')}", "data.type=csv", f"data.path={csv}",
                             "model.guidance_distilled=true"], schema=VideoTrainConfig)
    with pytest.raises(ConfigError, match="embeds the guidance value .* remove model.guidance_distilled"):
        resolve_pipeline(cfg)
    cfg = load_config(None, ["model.guidance_distilled=false"], schema=VideoTrainConfig)
    with pytest.raises(ConfigError, match="model.guidance_distilled .* remove it"):
        validate_video_config(cfg)


def test_a_full_fine_tune_exports_a_pipeline_folder_its_pipeline_class_loads(tiny_pipeline, tmp_path):
    """A full fine-tune (lora.rank 0, one step) from the Z-Image folder ends by writing <run>/diffusers: a
    ZImagePipeline folder with the transformer written fresh (the EMA weights the checkpoint holds) and the
    other components linked to the source folder."""
    from diffusers import ZImagePipeline
    from safetensors.torch import load_file

    folder, size = tiny_pipeline("z_image"), TINY_CALLS["z_image"]["height"]
    media = write_image(tmp_path / "0.png", size, size)
    main("train_video", [f"model.pipeline={folder}", "data.type=csv", f"data.image_size={size}",
                         f"data.path={write_csv(tmp_path, [(media, PROMPTS[0])])}", "precision=fp32",
                         "global_batch_size=1", "ckpt_every=0", "exp_name=full", f"results_dir={tmp_path}",
                         "logger=[]", "max_steps=1"])
    out = tmp_path / "full" / "diffusers"
    assert os.path.islink(out / "vae") and os.path.islink(out / "text_encoder")
    assert not os.path.islink(out / "transformer")
    pipe = ZImagePipeline.from_pretrained(str(out))
    ema = load_file(str(tmp_path / "full" / "checkpoints" / "full_step1" / "ema.safetensors"))
    state = pipe.transformer.state_dict()
    assert ema and ema.keys() <= state.keys()
    for k, v in ema.items():
        torch.testing.assert_close(state[k], v, rtol=0, atol=0, msg=k)
