"""HunyuanVideo 1.5's pipelines have no ``load_lora_weights`` (diffusers 0.42.1): a LoRA run on the tiny
``HunyuanVideo15Pipeline`` (2 steps on a captioned clip, ``train_video.py``) exports its adapters in the
file every pipeline's ``save_lora_weights`` writes, which the pipeline's ``transformer.load_lora_adapter``
loads without a key warning; ``sample_video.py`` samples through the pipeline with them, and its clips
equal, within 1e-5 in fp32, the pipeline called directly with the exported LoRA loaded (its VAE decoding
one clip at a time, as sampling has it do: it fails on a batch of two in diffusers 0.42.1)."""

import os

import pytest

from opendit_lite.families.tiny_pipelines import TINY_CALLS
from opendit_lite.interop.pretrained_files import LORA_WEIGHT_NAME
from tests.pipeline_runs import write_clip, write_csv
from tests.video_scripts.test_family_scripts import main
from tests.video_scripts.test_lora_export import LoadLog
from tests.video_scripts.test_pipeline_sampling import PROMPTS, _max_diff, direct, script_clips


@pytest.mark.slow  # a 2-step LoRA run and three pipeline calls on ~2000-token text streams: about 40 s on 2 cores
def test_a_hunyuan_video15_lora_samples_through_its_pipeline_with_the_exported_adapters(tiny_pipeline, tmp_path,
                                                                                         capsys):
    from diffusers import HunyuanVideo15Pipeline

    folder, call = tiny_pipeline("hunyuanvideo15"), dict(TINY_CALLS["hunyuanvideo15"])
    steps, frames, size = call.pop("num_inference_steps"), call["num_frames"], call["height"]
    media = write_clip(tmp_path / "0.mp4", frames, size, size)
    args = [f"model.pipeline={folder}", "data.type=csv", f"data.path={write_csv(tmp_path, [(media, PROMPTS[0])])}",
            f"data.image_size={size}", f"data.num_frames={frames}", "data.frame_interval=1", "precision=fp32",
            "global_batch_size=1", "lr=5e-3", "ckpt_every=0", "lora.rank=4", "lora.alpha=4", "exp_name=lora",
            f"results_dir={tmp_path}", "logger=[]"]
    main("train_video", [*args, "max_steps=2"])
    assert "pipe.transformer.load_lora_adapter(" in capsys.readouterr().out  # the end-of-run line says how to load it
    ours = script_clips("sample_video", [*args, f"sample.prompts={PROMPTS[:2]}", f"sample.num_sampling_steps={steps}"])

    pipe = HunyuanVideo15Pipeline.from_pretrained(folder)
    assert not hasattr(pipe, "load_lora_weights")
    pipe.vae.enable_slicing()  # diffusers 0.42.1's AutoencoderKLHunyuanVideo15 fails on a batch of two clips
    base = direct(pipe, PROMPTS[:2], num_inference_steps=steps, **call)
    with LoadLog() as log:
        pipe.transformer.load_lora_adapter(os.path.join(str(tmp_path), "lora", "diffusers"),
                                           weight_name=LORA_WEIGHT_NAME)
    assert not log.key_warnings(), log.text()
    reference = direct(pipe, PROMPTS[:2], num_inference_steps=steps, **call)
    assert ours.shape == (2, 3, frames, size, size)
    print(f"\nsample_video.py vs the direct call: {_max_diff(ours, reference):.2g}")
    assert _max_diff(ours, reference) <= 1e-5, _max_diff(ours, reference)
    assert _max_diff(reference, base) > 1e-5  # the LoRA changes the samples
