"""The planner counts what an edit model's images add to each sample, as the family's conditioning declares it
(``planned_tokens``): FLUX.1 Kontext's reference packed on the sequence axis (its preferred resolution at the
target's aspect ratio, about 4,100 tokens), Qwen-Image-Edit's reference tokens and the vision tokens its
prompt holds (about 1,370 at 1 MP; Edit-2509's 384 x 384 prompt image about 200), which ``text_tokens`` omits.
The pipeline class comes from ``model.pipeline``, from the release record ``model.path`` names, or from the
``model_index.json`` beside a local ``model.path`` transformer."""

import json
import types

import numpy as np
import pytest

from opendit_lite.families import FAMILIES
from opendit_lite.families.flux.conditioning_kontext import CONDITIONING as KONTEXT
from opendit_lite.families.qwen_image.conditioning_edit import EDIT, EDIT_PLUS, RELEASED_VISION, vision_tokens


def test_the_conditionings_declare_their_reference_and_vision_tokens():
    from diffusers.image_processor import VaeImageProcessor
    from transformers import Qwen2VLImageProcessor

    # Kontext: the reference's size by the rule __call__ follows (a released pipeline: VAE factor 8), 16 pixels a token
    release = types.SimpleNamespace(vae_scale_factor=8, image_processor=VaeImageProcessor(vae_scale_factor=16))
    for rows, columns in ((128, 128), (96, 160), (160, 80)):                        # latent rows and columns
        height, width = KONTEXT.reference_size(release, rows * 8, columns * 8)
        assert KONTEXT.planned_tokens(rows, columns) == ((height // 16) * (width // 16), 0)
    assert KONTEXT.planned_tokens(128, 128) == (4096, 0)
    # Qwen-Image-Edit: 1024 x 1024 (the area rule) -> 64 x 64 tokens; its prompt's picture at that size
    assert EDIT.planned_tokens(128, 128) == (4096, 1371) and EDIT_PLUS.planned_tokens(128, 128) == (4096, 198)
    assert FAMILIES["qwen_image"].conditioning.planned_tokens(128, 128) == (0, 0)    # text-to-image: nothing more
    # the vision tokens are the released processor's: its image grid, 2 x 2 patches merged into one token
    processor = Qwen2VLImageProcessor(min_pixels=RELEASED_VISION["min_pixels"],
                                      max_pixels=RELEASED_VISION["max_pixels"])
    for height, width in ((1024, 1024), (384, 384), (832, 1248)):
        grid = processor(images=[np.zeros((height, width, 3), np.uint8)], return_tensors="pt")["image_grid_thw"]
        assert vision_tokens(height, width) == int(grid.prod()) // 4 + 2, (height, width)


def test_the_planned_pipeline_comes_from_the_release_or_the_folder_beside_the_transformer(tmp_path):
    from opendit_lite.plan.from_config import planned_pipeline

    def cfg(path):
        return types.SimpleNamespace(model=types.SimpleNamespace(path=path))

    releases = {r.name: r for r in FAMILIES["qwen_image"].releases + FAMILIES["flux"].releases}
    assert planned_pipeline(cfg(None), releases["Qwen-Image-Edit-2509"]) == "QwenImageEditPlusPipeline"
    assert planned_pipeline(cfg(None), releases["FLUX.1-Kontext-dev"]) == "FluxKontextPipeline"
    assert planned_pipeline(cfg(None), releases["Qwen-Image"]) is None
    (tmp_path / "transformer").mkdir()
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "QwenImageEditPipeline"}))
    assert planned_pipeline(cfg(str(tmp_path / "transformer")), None) == "QwenImageEditPipeline"
    assert planned_pipeline(cfg(str(tmp_path / "elsewhere" / "transformer")), None) is None


@pytest.mark.parametrize("name", ["qwenimage_edit_plus"])
def test_a_plan_of_an_edit_folder_counts_the_reference_and_vision_tokens(name, tiny_pipeline, tmp_path):
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.plan import plan_config
    from opendit_lite.plan.memory_model import GiB, activation_bytes

    csv = tmp_path / "edits.csv"
    csv.write_text("path,text,image\n")
    cfg = load_config("configs/qwen_image_edit_lora.yaml", [f"model.pipeline={tiny_pipeline(name)}",
                                                              f"data.path={csv}", "data.image_size=32"],
                      schema=VideoTrainConfig)
    result, buckets, shape = plan_config(cfg, memory_gib=80, world_size=1)
    (bucket,) = result.costs.buckets
    assert bucket.extra_tokens == 4096 and result.costs.caption_tokens == 512 + 198
    assert result.costs.tokens == 4096 + (32 // 4) ** 2                 # the tiny VAE: 2x, then patches of 2
    s = result.setting
    per_sample = activation_bytes(shape, bucket.frames, bucket.height, bucket.width, 1, 2, s.sp_size,
                                  s.selective_ratio, s.offload, 512 + 198, 4096) / GiB
    assert result.activation_gib_per_sample[bucket.name] == pytest.approx(per_sample)
    assert any("reference image as QwenImageEditPlusPipeline sizes it: 4096 tokens" in a and "198 vision tokens" in a
               for a in result.assumptions), result.assumptions
    assert f"{4096 + 64:>12}" in result.table(result.costs.buckets, shape)
