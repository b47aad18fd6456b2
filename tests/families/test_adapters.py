"""Each family adapter on the family's tiny random model: a clip batch goes through the adapter's
forward to a prediction of the clip's shape, and the recipe's objective gives a finite loss whose
backward reaches the model's parameters; packing and unpacking are inverse; a condition-dropped
sample sees the null caption."""

import pytest
import torch

from opendit_lite.builders.objective import objective_for_recipe
from opendit_lite.diffusion.loss import objective_loss
from opendit_lite.families import FamilyDenoiser, family_adapter
from opendit_lite.families.adapter_base import pack_patches, unpack_patches
from tests import diffusers_families as families

# name -> clip [C, T, H, W] the tiny model takes (Flux and SD3: images as 1-frame clips).
CLIPS = {
    "WanTransformer3DModel": (4, 3, 4, 6),
    "FluxTransformer2DModel": (4, 1, 4, 6),
    "SD3Transformer2DModel": (4, 1, 8, 6),
    "CogVideoXTransformer3DModel": (4, 3, 8, 6),
    "CogVideoX1.5": (4, 2, 8, 6),
    "HunyuanVideoTransformer3DModel": (4, 3, 4, 6),
    "LTXVideoTransformer3DModel": (8, 3, 4, 6),
    "ZImageTransformer2DModel": (4, 1, 4, 6),
    "QwenImageTransformer2DModel": (4, 1, 4, 6),
    "Flux2Transformer2DModel": (16, 1, 4, 6),
    "HunyuanVideo15Transformer3DModel": (4, 3, 4, 6),
}
TOKENS, WIDTH_SEED = 5, 3


def denoiser_for(name: str):
    model = families.build(name)
    adapter = family_adapter(model)
    width = adapter.text_width(model.config)
    return FamilyDenoiser(adapter, model, model.config, TOKENS, width), model


def batch(name: str, width: int, B: int = 2):
    g = torch.Generator().manual_seed(WIDTH_SEED)
    x = torch.randn(B, *CLIPS[name], generator=g)                              # [B, C, T, H, W]
    y = torch.randn(B, TOKENS, width, generator=g)                             # [B, M, W]
    mask = torch.arange(TOKENS)[None] < torch.tensor([TOKENS, 3])[:, None]     # [B, M]
    return x, y, mask


@pytest.mark.parametrize("name", list(CLIPS))
def test_adapter_forward_shape_and_loss_backprops(name):
    denoiser, model = denoiser_for(name)
    x, y, mask = batch(name, denoiser.text_width)
    t = torch.tensor([250.0, 900.0])
    out = denoiser(x, t, y, mask)
    assert out.shape == x.shape
    recipe = denoiser.adapter.recipe(model.config, tokens=16)
    objective = objective_for_recipe(recipe)
    loss = objective_loss(objective, denoiser, x, dict(y=y, mask=mask, drop=torch.tensor([False, True])))
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert sum(g is not None and bool(g.abs().sum() > 0) for g in grads) > len(grads) // 2


@pytest.mark.parametrize("pt,p", [(1, 2), (2, 1), (1, 1)])
def test_pack_unpack_are_inverse_and_pack_is_patch_major(pt, p):
    x = torch.randn(2, 3, 4, 4, 6)
    tokens = pack_patches(x, pt, p)
    assert tokens.shape == (2, (4 // pt) * (4 // p) * (6 // p), 3 * pt * p * p)
    assert torch.equal(unpack_patches(tokens, x.shape, pt, p), x)
    # reference: token (f, r, c) holds x[:, :, f*pt:(f+1)*pt, r*p:(r+1)*p, c*p:(c+1)*p] flattened channel-first
    f, r, c = 1, 1, 2
    index = (f * (4 // p) + r) * (6 // p) + c
    expected = x[:, :, f * pt:(f + 1) * pt, r * p:(r + 1) * p, c * p:(c + 1) * p].reshape(2, -1)
    assert torch.equal(tokens[:, index], expected)


def test_dropped_sample_sees_the_null_caption():
    denoiser, _ = denoiser_for("HunyuanVideoTransformer3DModel")
    x, y, mask = batch("HunyuanVideoTransformer3DModel", denoiser.text_width)
    t = torch.tensor([500.0, 500.0])
    with torch.no_grad():
        dropped = denoiser(x, t, y, mask, drop=torch.tensor([True, False]))
        null = denoiser(x, t, denoiser.null_caption(2), torch.ones_like(mask))
        kept = denoiser(x, t, y, mask)
    torch.testing.assert_close(dropped[0], null[0])
    torch.testing.assert_close(dropped[1], kept[1])


def test_pooled_text_is_the_masked_mean_projected():
    denoiser, _ = denoiser_for("FluxTransformer2DModel")                      # text 32 wide, pooled 16
    _, y, mask = batch("FluxTransformer2DModel", 32)
    pooled = denoiser.pooled(y, mask)
    mean = torch.stack([y[0].mean(0), y[1, :3].mean(0)])
    projection = torch.randn(32, 16, generator=torch.Generator().manual_seed(0)) / 32 ** 0.5
    torch.testing.assert_close(pooled, mean @ projection)
