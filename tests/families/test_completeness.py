"""Every registered diffusers family is whole: its folder holds the same pieces as every other
family's, its record names one class throughout, and each piece is registered with the mechanism
that looks it up (capabilities, sequence parallelism, fused AdaLN; its step-cache piece reads a block
class of the installed diffusers), so no family is half-registered.
The registry refuses a duplicate and a record whose pieces disagree, before registering anything."""

import dataclasses
import importlib
import os

import pytest
import torch

import opendit_lite.families as families
from opendit_lite.converter import adaln_model_notes
from opendit_lite.converter.adaln_protocol import ADALN_BLOCK_FAMILIES
from opendit_lite.errors import ConfigError
from opendit_lite.families import FAMILIES, Family, find_family, register_family, unregistered_pieces
from opendit_lite.families.tiny_pipelines import TINY_PIPELINES
from opendit_lite.models.capabilities import block_lists, lora_targets
from opendit_lite.parallel import FAMILIES as SP_SPECS

FOLDER = os.path.dirname(families.__file__)
PIECES = {"__init__.py", "adapter.py", "sp_spec.py", "fused_norms.py", "encoding.py", "conditioning.py", "tiny.py",
          "step_cache.py"}
EXPECTED = {"wan", "hunyuan_video", "hunyuan_video15", "cogvideox", "ltx_video", "flux", "sd3", "z_image", "flux2",
            "qwen_image"}
# Optional pieces: a family holds the file exactly when its record names the piece (not None).
OPTIONAL = {"original_lora.py": "original_lora"}
# The families with an original checkpoint layout for LoRA files (ComfyUI's); CogVideoX has none.
ORIGINAL_LORA = {"wan", "hunyuan_video", "ltx_video", "flux", "sd3", "qwen_image", "flux2", "z_image"}


def _folders():
    return sorted(name for name in os.listdir(FOLDER)
                  if os.path.isfile(os.path.join(FOLDER, name, "__init__.py")))


def test_the_six_families_each_have_a_folder_and_a_record():
    assert set(_folders()) == EXPECTED
    assert set(FAMILIES) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_family_folder_holds_every_piece(name):
    files = {f for f in os.listdir(os.path.join(FOLDER, name)) if f.endswith(".py")}
    for optional, field in OPTIONAL.items():
        assert (optional in files) == (getattr(FAMILIES[name], field) is not None), (name, optional)
    files -= set(OPTIONAL)
    # a variant pipeline's conditioning (image-to-video, edit) in conditioning_<variant>.py, defined in the folder
    variants = {f for f in files if f.startswith("conditioning_")}
    assert files - variants == PIECES, f"families/{name}/ holds {sorted(files)}; every family holds {sorted(PIECES)}"
    for variant in FAMILIES[name].variants:
        module = type(variant.conditioning).__module__
        assert module.startswith(f"opendit_lite.families.{name}."), f"{variant.pipeline}'s conditioning is in {module}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_piece_is_registered_with_its_mechanism(name):
    family = FAMILIES[name]
    assert unregistered_pieces(family) == []
    # through the mechanisms' own readers, on the real diffusers class
    cls = getattr(importlib.import_module(family.module), family.class_name)
    assert block_lists(cls) == family.block_lists
    assert lora_targets(cls) == family.lora_targets
    assert SP_SPECS[family.class_name] is family.sp_spec
    notes = adaln_model_notes(cls.__new__(cls))
    assert notes is not None and notes.fused == family.fused_norms.fused
    names = {f.name for f in ADALN_BLOCK_FAMILIES}
    assert all(f"diffusers {b.class_name}" in names for b in family.fused_norms.blocks)
    for block in family.fused_norms.blocks:  # each swapped block class exists in the installed diffusers
        assert isinstance(getattr(importlib.import_module(block.module_name), block.class_name, None), type)
    # the step-cache piece reads the arguments of a block class of the installed diffusers
    assert isinstance(getattr(importlib.import_module(family.module), family.step_cache.head_block, None), type)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_record_names_one_class_and_is_found_every_way(name):
    family = FAMILIES[name]
    assert family.adapter.class_name == family.sp_spec.cls_name == family.encoding.transformer == family.class_name
    assert family.sp_spec.family == name
    assert families.family_of(family.class_name) is family and families.is_family(family.class_name)
    assert families.family_adapter(family.class_name) is family.adapter
    assert find_family(name) is find_family(family.class_name) is family
    for alias in family.aliases:
        assert find_family(alias) is family
    assert families.family_of_pipeline(family.pipeline) is family  # the pipeline it reproduces points back to it
    assert family.tiny and all(t.name in TINY_PIPELINES and TINY_PIPELINES[t.name] is t for t in family.tiny)


def test_the_families_with_an_original_layout_declare_its_lora_names():
    from opendit_lite.families.original_lora_spec import OriginalLoRA

    assert {name for name, f in FAMILIES.items() if f.original_lora is not None} >= ORIGINAL_LORA
    for name in ORIGINAL_LORA:
        spec = FAMILIES[name].original_lora
        assert isinstance(spec, OriginalLoRA) and spec.layers and spec.prefix == "diffusion_model."
    assert FAMILIES["cogvideox"].original_lora is None


def test_old_short_names_still_find_their_family():
    assert find_family("hunyuanvideo").name == "hunyuan_video" and find_family("ltx").name == "ltx_video"
    with pytest.raises(ConfigError, match="unknown family 'wann'"):
        find_family("wann")


def test_a_duplicate_or_inconsistent_record_is_refused_before_anything_is_registered():
    wan = FAMILIES["wan"]
    with pytest.raises(ValueError, match="already registered"):
        register_family(wan)
    with pytest.raises(ValueError, match="already registered"):
        register_family(dataclasses.replace(wan, name="wan2", sp_spec=dataclasses.replace(wan.sp_spec, family="wan2"),
                                            step_cache=dataclasses.replace(wan.step_cache, family="wan2")))
    flux = FAMILIES["flux"]
    with pytest.raises(ValueError, match="sp_spec is for 'FluxTransformer2DModel'"):
        register_family(dataclasses.replace(wan, name="mixed", class_name="MixedModel", sp_spec=flux.sp_spec))
    with pytest.raises(ValueError, match="step_cache is for 'flux'"):
        register_family(dataclasses.replace(wan, step_cache=flux.step_cache))
    with pytest.raises(ValueError, match="no TeaCache signal and says no reason"):
        register_family(dataclasses.replace(wan, step_cache=dataclasses.replace(wan.step_cache, teacache_signal=None)))
    assert "mixed" not in FAMILIES and "wan2" not in FAMILIES and "MixedModel" not in SP_SPECS
    assert isinstance(wan, Family)


# The released checkpoints the records hold, with their size as announced (billions of parameters).
RELEASE_BILLIONS = {"Wan-AI/Wan2.1-T2V-14B-Diffusers": 14, "black-forest-labs/FLUX.1-dev": 12,
                    "hunyuanvideo-community/HunyuanVideo": 13, "hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v": 8,
                    # announced as 14B: the DiT's; the image cross-attention's own key/value projections add 2.1B
                    "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers": 16,
                    "Wan-AI/Wan2.2-I2V-A14B-Diffusers": 14, "Wan-AI/Wan2.2-TI2V-5B-Diffusers": 5,
                    "Tongyi-MAI/Z-Image-Turbo": 6, "Tongyi-MAI/Z-Image": 6,
                    "black-forest-labs/FLUX.1-Kontext-dev": 12,
                    "black-forest-labs/FLUX.2-dev": 32, "Qwen/Qwen-Image": 20,
                    "Qwen/Qwen-Image-Edit": 20, "Qwen/Qwen-Image-Edit-2509": 20}


def test_every_release_builds_its_class_at_its_announced_size():
    releases = {r.repo: (family, r) for family in FAMILIES.values() for r in family.releases}
    assert set(releases) == set(RELEASE_BILLIONS)
    for repo, (family, release) in releases.items():
        cls = getattr(importlib.import_module(family.module), family.class_name)
        with torch.device("meta"):  # the architecture only: no memory
            model = cls(**release.config)
        billions = sum(p.numel() for p in model.parameters()) / 1e9
        assert round(billions) == RELEASE_BILLIONS[repo], f"{repo}: {billions:.2f}B parameters"
