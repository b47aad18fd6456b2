"""HunyuanVideo 1.5's pipelines have no ``load_lora_weights`` (diffusers 0.42.1): a LoRA run on the tiny
``HunyuanVideo15Pipeline`` or ``HunyuanVideo15ImageToVideoPipeline`` (2 steps on a captioned clip,
``train_video.py``) exports its adapters in the file every pipeline's ``save_lora_weights`` writes, which
the pipeline's ``transformer.load_lora_adapter`` loads without a key warning; ``sample_video.py`` samples
through the pipeline with them (classifier-free guidance 3 on its guider; image-to-video with
``sample.images``), and its clips equal, within 1e-5 in fp32, the pipeline called directly with the
exported LoRA loaded (its VAE decoding one clip at a time, as sampling has it do: it fails on a batch of
two in diffusers 0.42.1)."""

import os

import pytest
import torch

from opendit_lite.diffusion.sampling_utils import SampleGenerators
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from opendit_lite.interop.pretrained_files import LORA_WEIGHT_NAME
from tests.pipeline_runs import write_clip, write_csv, write_image
from tests.video_scripts.test_family_scripts import main
from tests.video_scripts.test_lora_export import LoadLog
from tests.video_scripts.test_pipeline_sampling import PROMPTS, _max_diff, script_clips

SIZE, FRAMES, STEPS, GUIDANCE = 32, 5, 2, 3.0


def _direct(pipe, prompts, image=None) -> torch.Tensor:
    """The pipeline called directly, prompt i's noise from generator (0, i) (one call per prompt with an
    image): [N, 3, T, H, W] in [-1, 1]."""
    from opendit_lite.sampling.pipeline_sampling import pipeline_pixels

    pipe.guider = pipe.guider.new(guidance_scale=GUIDANCE)
    generators = SampleGenerators(0, range(len(prompts))).generators
    call = dict(num_frames=FRAMES, num_inference_steps=STEPS, output_type="pt")
    with torch.no_grad():
        if image is None:
            return pipeline_pixels(pipe(prompt=list(prompts), generator=generators, height=SIZE, width=SIZE,
                                        **call)).float()
        return torch.cat([pipeline_pixels(pipe(prompt=p, image=image, generator=[g], **call)).float()
                          for p, g in zip(prompts, generators)])


@pytest.mark.slow  # a 2-step LoRA run and three pipeline calls on ~2000-token text streams: 1.5-2.5 min on 2 cores
@pytest.mark.parametrize("name", ["hunyuanvideo15", "hunyuanvideo15_i2v"])
def test_a_hunyuan_video15_lora_samples_through_its_pipeline_with_the_exported_adapters(name, tiny_pipeline, tmp_path,
                                                                                         capsys):
    from diffusers import DiffusionPipeline
    from PIL import Image

    folder = tiny_pipeline(name)
    assert TINY_CALLS[name]["num_frames"] == FRAMES
    media = write_clip(tmp_path / "0.mp4", FRAMES, SIZE, SIZE)
    args = [f"model.pipeline={folder}", "data.type=csv", f"data.path={write_csv(tmp_path, [(media, PROMPTS[0])])}",
            f"data.image_size={SIZE}", f"data.num_frames={FRAMES}", "data.frame_interval=1", "precision=fp32",
            "global_batch_size=1", "lr=5e-3", "ckpt_every=0", "lora.rank=4", "lora.alpha=4", "exp_name=lora",
            f"results_dir={tmp_path}", "logger=[]"]
    main("train_video", [*args, "max_steps=2"])
    assert "pipe.transformer.load_lora_adapter(" in capsys.readouterr().out  # the end-of-run line says how to load it
    image = write_image(tmp_path / "first.png", SIZE, SIZE) if name.endswith("i2v") else None
    sampling = [f"sample.prompts={PROMPTS[:2]}", f"sample.num_sampling_steps={STEPS}", f"sample.cfg_scale={GUIDANCE}"]
    if image:
        sampling.append(f"sample.images={[image, image]}")
    ours = script_clips("sample_video", [*args, *sampling])

    pipe = DiffusionPipeline.from_pretrained(folder)
    assert not hasattr(pipe, "load_lora_weights")
    pipe.vae.enable_slicing()  # diffusers 0.42.1's AutoencoderKLHunyuanVideo15 fails on a batch of two clips
    picture = Image.open(image).convert("RGB") if image else None
    base = _direct(pipe, PROMPTS[:2], picture)
    with LoadLog() as log:
        pipe.transformer.load_lora_adapter(os.path.join(str(tmp_path), "lora", "diffusers"),
                                           weight_name=LORA_WEIGHT_NAME)
    assert not log.key_warnings(), log.text()
    reference = _direct(pipe, PROMPTS[:2], picture)
    print(f"\n{name}: sample_video.py vs the direct call: {_max_diff(ours, reference):.2g}")
    assert ours.shape == (2, 3, FRAMES, SIZE, SIZE)
    assert _max_diff(ours, reference) <= 1e-5, _max_diff(ours, reference)
    assert _max_diff(reference, base) > 1e-5  # the LoRA changes the samples
