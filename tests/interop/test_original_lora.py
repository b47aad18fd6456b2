"""LoRA adapters in each family's original checkpoint layout (``export.lora_format: comfyui``,
``interop.comfyui_lora``) and back (``lora.init_from``, ``interop.lora_import``).

Per family, one adapted tiny transformer (rank 4, alpha 8: scale 2) is exported in both formats; then

* diffusers' own loader reads the ComfyUI file (``<Pipeline>.lora_state_dict``, where its
  non-diffusers converters run, then ``load_lora_into_transformer``: what ``load_lora_weights`` does)
  into a fresh transformer beside the diffusers-format file, and every adapted layer's update
  ``scaling * B @ A`` (the change to its weight) is the same from both files (fp32, 1e-6) and equals
  the trained one. SD3 has no such converter: its file is checked against what diffusers' single-file
  checkpoint converter does to a fused ``qkv`` (chunked in three), written here;
* ``lora.init_from`` of either file gives a freshly adapted model the trained adapters' own weights;
* the ``alpha`` keys (kohya style) carry the trained scale: alpha / rank = lora_alpha / r.

Where a family's diffusers converter cannot read a layer (Flux's and HunyuanVideo's single-block
``linear1`` is split by the released width; HunyuanVideo's refiner ``self_attn_qkv`` lora_A is split
by rows), those layers are left
out of the diffusers comparison only: the round trip covers them.
"""

import inspect
import re

import diffusers
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from opendit_lite.errors import ConfigError
from opendit_lite.families import FAMILIES, family_of
from opendit_lite.interop import LORA_WEIGHT_NAME, export_lora
from opendit_lite.interop.comfyui_lora import COMFYUI_WEIGHT_NAME, diffusers_parts, export_original_lora
from opendit_lite.interop.family_checkpoint import check_lora_format
from opendit_lite.interop.lora_import import check_lora_file, load_lora_file
from opendit_lite.models.capabilities import lora_targets
from opendit_lite.models.lora import apply_lora
from tests.diffusers_families import build, randomize_adapters

RANK, ALPHA, TOL = 4, 8.0, 1e-6
# the layers each family's diffusers converter cannot read at the tiny size (see the module docstring)
NOT_READ_BY_DIFFUSERS = {
    "FluxTransformer2DModel": r"single_transformer_blocks\.\d+\.(attn\.to_[qkv]|proj_mlp)",
    "HunyuanVideoTransformer3DModel": r"(single_transformer_blocks\.\d+\.(attn\.to_[qkv]|proj_mlp)"
                                      r"|context_embedder\.token_refiner\.refiner_blocks\.\d+\.attn\.to_[qkv])",
}
CONVERTED = ("WanTransformer3DModel", "FluxTransformer2DModel", "HunyuanVideoTransformer3DModel",
             "LTXVideoTransformer3DModel", "QwenImageTransformer2DModel", "Flux2Transformer2DModel",
             "ZImageTransformer2DModel")
# case -> (tests.diffusers_families model, constructor overrides, layers adapted beyond the family's targets)
CASES = {
    **{family: (family, {}, ()) for family in CONVERTED + ("SD3Transformer2DModel",)},
    "SD3.5-dual-attention": ("SD3.5-dual-attention", {}, ()),  # x_block.attn2.qkv
    # Wan image-to-video: the cross-attention's image keys and values (cross_attn.k_img / v_img)
    "Wan-i2v": ("WanTransformer3DModel", dict(image_dim=16, added_kv_proj_dim=24), ("add_k_proj", "add_v_proj")),
    # Z-Image with its refiner blocks (noise_refiner, context_refiner: the tiny model has none)
    "Z-Image-refiners": ("ZImageTransformer2DModel", dict(n_refiner_layers=1), ()),
}


def _adapted(case: str, seed: int) -> torch.nn.Module:
    name, overrides, extra = CASES.get(case, (case, {}, ()))
    model = build(name, **overrides)
    torch.manual_seed(seed)  # peft draws A at random: each seed its own adapters
    apply_lora(model, rank=RANK, alpha=ALPHA, dropout=0.0, targets=lora_targets(model) + extra)
    return randomize_adapters(model, seed=seed).eval()


def _updates(model: torch.nn.Module, adapter: str = "default") -> dict:
    """layer -> its adapter's change to the layer's weight, scaling * B @ A [out, in]."""
    from peft.tuners.lora import LoraLayer

    return {name: m.scaling[adapter] * m.lora_B[adapter].weight.float() @ m.lora_A[adapter].weight.float()
            for name, m in model.named_modules() if isinstance(m, LoraLayer) and adapter in m.lora_A}


def _adapter_weights(model: torch.nn.Module) -> dict:
    return {k: v for k, v in model.state_dict().items() if ".lora_" in k}


def _load_like_the_pipeline(pipeline, source, transformer, adapter_name):
    """What ``pipeline.load_lora_weights(source, adapter_name=...)`` does to its transformer."""
    state, metadata = pipeline.lora_state_dict(source, return_lora_metadata=True)
    kwargs = dict(transformer=transformer, metadata=metadata, adapter_name=adapter_name)
    if "network_alphas" in inspect.signature(pipeline.load_lora_into_transformer).parameters:
        kwargs["network_alphas"] = None
    pipeline.load_lora_into_transformer(state, **kwargs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_comfyui_file_loads_as_the_diffusers_file_and_starts_a_run_with_the_same_adapters(case, tmp_path):
    trained = _adapted(case, seed=1)
    family = type(trained).__name__
    out = str(tmp_path / "lora")
    export_lora(trained, out)
    export_original_lora(trained, out)
    comfy = load_file(f"{out}/{COMFYUI_WEIGHT_NAME}")
    spec = family_of(family).original_lora
    assert all(k.startswith("diffusion_model.") for k in comfy)
    variant_layer = {"SD3.5-dual-attention": ".x_block.attn2.qkv.", "Wan-i2v": ".cross_attn.k_img.",
                     "Z-Image-refiners": ".context_refiner.0.attention.qkv."}.get(case)
    assert variant_layer is None or any(variant_layer in k for k in comfy)
    if spec.keys != "peft":  # the alpha keys carry the trained scale: alpha / rank = lora_alpha / r
        down = ".lora_down.weight" if spec.keys == "kohya" else ".lora.down.weight"
        alphas = {k[:-len(".alpha")]: v.item() for k, v in comfy.items() if k.endswith(".alpha")}
        assert alphas and all(a / comfy[k + down].shape[0] == ALPHA / RANK for k, a in alphas.items())
    else:
        assert not any(k.endswith(".alpha") for k in comfy)
    expected = _updates(trained)

    if family in CONVERTED:  # diffusers' own non-diffusers converter reads the file
        skip = NOT_READ_BY_DIFFUSERS.get(family)
        readable = {k: v for k, v in comfy.items() if skip is None or not any(
            re.fullmatch(skip, p) for p in diffusers_parts(spec, _layer(k)))}
        pipeline = getattr(diffusers, family_of(family).pipeline)
        fresh = build(CASES[case][0], **CASES[case][1]).eval()
        _load_like_the_pipeline(pipeline, out, fresh, "diffusers")
        _load_like_the_pipeline(pipeline, readable, fresh, "comfyui")
        from_diffusers, from_comfy = _updates(fresh, "diffusers"), _updates(fresh, "comfyui")
        assert from_diffusers.keys() == expected.keys()
        compared = [n for n in expected if skip is None or not re.fullmatch(skip, n)]
        assert len(compared) >= len(expected) // 2
        for name in compared:
            assert (from_comfy[name] - from_diffusers[name]).abs().max() < TOL, name
            assert (from_diffusers[name] - expected[name]).abs().max() < TOL, name
        for name, update in from_comfy.items():  # layers the converter gave an adapter beyond: no change
            if name not in compared:
                assert name in expected or update.abs().max() == 0, name
    else:  # SD3: what the single-file converter does to a fused qkv (chunked in three), on the LoRA update
        for key in [k for k in comfy if k.endswith(".lora_down.weight")]:
            layer = key[len("diffusion_model."):-len(".lora_down.weight")]
            down, up = comfy[key], comfy[key.replace("lora_down", "lora_up")]
            update = comfy[key.replace("lora_down.weight", "alpha")] / down.shape[0] * up @ down
            parts = [p for o, ps in spec.layers for p in ps if _matches(o, layer)]
            pieces = update.chunk(len(parts), dim=0) if len(parts) > 1 else (update,)
            index = re.search(r"joint_blocks\.(\d+)", layer).group(1)
            for part, piece in zip(parts, pieces):
                assert (piece - expected[part.format(i=index)]).abs().max() < TOL, (layer, part)

    # lora.init_from: either file gives a fresh adapted model the trained adapters' weights
    want = _adapter_weights(trained)
    for name in (LORA_WEIGHT_NAME, COMFYUI_WEIGHT_NAME):
        resumed = _adapted(case, seed=7)
        assert check_lora_file(f"{out}/{name}", family) == ("comfyui" if name == COMFYUI_WEIGHT_NAME else "diffusers")
        assert "of the model's" in load_lora_file(resumed, f"{out}/{name}")
        got = _adapter_weights(resumed)
        assert got.keys() == want.keys()
        assert max((got[k] - want[k]).abs().max().item() for k in want) == 0.0, name


def _layer(key: str) -> str:
    """The original layer of a ComfyUI file's key."""
    return re.sub(r"\.(lora_(down|up|A|B)\.weight|alpha)$", "", key[len("diffusion_model."):])


def _matches(template: str, layer: str) -> bool:
    return re.fullmatch(re.escape(template).replace(re.escape("{i}"), r"\d+"), layer) is not None


def test_a_family_without_original_layout_and_bad_files_are_refused_in_one_paragraph(tmp_path):
    cog = "CogVideoXTransformer3DModel"
    assert FAMILIES["cogvideox"].original_lora is None
    model = _adapted(cog, seed=1)
    with pytest.raises(ConfigError, match="cogvideox family declares no original checkpoint layout"):
        export_original_lora(model, str(tmp_path / "cog"))
    for fmt in ("comfyui", "both"):  # export.lora_format's check, before a run starts
        with pytest.raises(ConfigError, match="cogvideox family declares no original .*export.lora_format: diffusers"):
            check_lora_format(cog, fmt)
    with pytest.raises(ConfigError, match="not a LoRA file format"):
        check_lora_format("WanTransformer3DModel", "kohya")
    export_lora(model, str(tmp_path / "cog"))  # the diffusers format starts a CogVideoX run
    assert re.match(r"lora.init_from: (\d+) of the model's \1 adapted layers",
                    load_lora_file(_adapted(cog, seed=3), str(tmp_path / "cog")))

    wan = _adapted("WanTransformer3DModel", seed=1)
    export_original_lora(wan, str(tmp_path / "wan"))
    save_file({"text_encoder.x.lora_A.weight": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ConfigError, match="neither the diffusers LoRA format"):
        check_lora_file(str(tmp_path / "other.safetensors"), "WanTransformer3DModel")
    narrow = build("WanTransformer3DModel")
    apply_lora(narrow, rank=2, alpha=ALPHA, dropout=0.0)
    with pytest.raises(ConfigError, match="rank-2 adapters|set lora.rank"):
        load_lora_file(narrow, str(tmp_path / "wan"))
    fewer = build("WanTransformer3DModel")
    apply_lora(fewer, rank=RANK, alpha=ALPHA, dropout=0.0, targets=["to_q"])
    with pytest.raises(ConfigError, match="lora.targets do not adapt"):
        load_lora_file(fewer, str(tmp_path / "wan"))
    with pytest.raises(ConfigError, match="not a .safetensors file"):
        check_lora_file(str(tmp_path / "missing.safetensors"), "WanTransformer3DModel")
    with pytest.raises(ConfigError, match="not a diffusers family"):
        check_lora_file(str(tmp_path / "wan"), "DiT-S/2")
    with safe_open(f"{tmp_path}/wan/{COMFYUI_WEIGHT_NAME}", "pt") as f:  # the trained rank and alpha, sd-scripts' names
        assert f.metadata() == {"ss_network_dim": str(RANK), "ss_network_alpha": str(ALPHA)}


def test_a_fused_layer_with_one_shared_down_matrix_splits_into_each_layers_adapter(tmp_path):
    """Some trainers write a fused qkv adapter of rank r whose down matrix q, k and v share: each layer
    gets that down matrix and its rows of the up matrix (reference: the fused update chunked in three,
    as diffusers' single-file converter splits qkv). A dense up matrix of rank 3 r is no sum of
    per-layer adapters: refused."""
    model = _adapted("SD3Transformer2DModel", seed=3)
    g = torch.Generator().manual_seed(0)
    down, up = torch.randn(RANK, 16, generator=g), torch.randn(3 * 16, RANK, generator=g)   # [r, in], [3 out, r]
    layer = "diffusion_model.joint_blocks.0.x_block.attn.qkv"
    path = str(tmp_path / "shared.safetensors")
    save_file({f"{layer}.lora_down.weight": down, f"{layer}.lora_up.weight": up,
               f"{layer}.alpha": torch.tensor(2.0 * RANK)}, path)  # scale 2
    assert load_lora_file(model, path).startswith("lora.init_from: 3 of the model's")
    reference = (2.0 * up @ down).chunk(3, dim=0)
    updates = _updates(model)
    for part, want in zip(("to_q", "to_k", "to_v"), reference):
        assert (updates[f"transformer_blocks.0.attn.{part}"] - want).abs().max() < TOL, part
    save_file({f"{layer}.lora_down.weight": torch.randn(3 * RANK, 16, generator=g),
               f"{layer}.lora_up.weight": torch.randn(3 * 16, 3 * RANK, generator=g)}, path)
    with pytest.raises(ConfigError, match="not block diagonal"):
        load_lora_file(model, path)
