"""The video models: shapes, gradients, guidance, registry entries and XL sizes (on the meta device)."""

import pytest
import torch

from opendit_lite.models.layers.rope import apply_rope, rope_1d, rope_2d
from opendit_lite.models.registry import MODELS, build_model
from opendit_lite.models.stdit import STDiT
from opendit_lite.models.vchitect import VchitectXL

TINY = ["STDiT-tiny", "Vchitect-tiny"]


def _inputs(batch=2, frames=3, size=6):
    torch.manual_seed(0)
    return (torch.randn(batch, 4, frames, size, size), torch.tensor([3.0, 900.0])[:batch],
            torch.randn(batch, 8, 32), torch.ones(batch, 8, dtype=torch.bool))


@pytest.mark.parametrize("name", TINY)
def test_forward_backward_every_parameter_gets_a_gradient(name):
    model = build_model(name, class_dropout_prob=1.0).train()  # always the null caption: it gets a gradient too
    for p in model.parameters():  # leave the zero-initialised outputs, so gradients reach every branch
        torch.nn.init.normal_(p, std=0.05)
    x, t, y, mask = _inputs()
    out = model(x, t, y, mask)
    assert out.shape == (2, model.out_channels, 3, 6, 6)
    out.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"parameters without gradient: {missing}"


@pytest.mark.parametrize("name", TINY)
def test_zero_init_predicts_zero_and_cfg_shapes(name):
    model = build_model(name).eval()
    x, t, y, mask = _inputs()
    assert model(x, t, y, mask).abs().max() == 0  # zero-initialised output layer
    out = model.forward_with_cfg(x, t, y, cfg_scale=4.0, mask=mask)
    assert out.shape == (2, model.out_channels, 3, 6, 6)


def test_cfg_is_uncond_plus_scale_times_difference():
    model = build_model("STDiT-tiny", learn_sigma=False).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.05)
    x, t, y, _ = _inputs()
    cond = model(x, t, y)
    uncond = model(x, t, model.null_caption(2))
    torch.testing.assert_close(model.forward_with_cfg(x, t, y, 3.0), uncond + 3.0 * (cond - uncond),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", TINY)
def test_caption_padding_is_masked(name):
    """What sits in the padded caption positions does not change the video output, and a sample's
    output does not depend on the padding of the other samples in its batch."""
    model = build_model(name, class_dropout_prob=0.0).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.05)
    x, t, y, mask = _inputs()
    mask[0, 3:] = False
    other = y.clone()
    other[0, 3:] = torch.randn(5, 32) * 10
    torch.testing.assert_close(model(x, t, y, mask), model(x, t, other, mask), atol=1e-5, rtol=1e-5)
    alone = model(x[:1], t[:1], y[:1], mask[:1])  # batched with a caption of no padding above, alone here
    torch.testing.assert_close(model(x, t, y, mask)[:1], alone, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(model(x, t, y, mask), model(x, t, y, torch.ones_like(mask)), atol=1e-4)


@pytest.mark.parametrize("name", TINY)
def test_any_clip_shape_runs(name):
    """One model, several (T, H, W): non-square frames, one frame (an image), more frames."""
    model = build_model(name).eval()
    _, t, y, mask = _inputs()
    for shape in [(1, 6, 10), (5, 8, 4), (2, 12, 12)]:
        assert model(torch.randn(2, 4, *shape), t, y, mask).shape == (2, model.out_channels, *shape)


def test_bad_inputs_have_clear_errors():
    model = build_model("STDiT-tiny")
    x, t, y, _ = _inputs()
    with pytest.raises(ValueError, match="caption states must be"):
        model(x, t, torch.randn(2, 7, 32))
    with pytest.raises(ValueError, match="not divisible by the patch size"):
        model(torch.randn(2, 4, 3, 5, 6), t, y)


def test_xl_configs_on_meta_device():
    assert {"STDiT-XL/2", "STDiT-tiny", "Vchitect-XL", "Vchitect-tiny"} <= set(MODELS)
    with torch.device("meta"):
        stdit = build_model("STDiT-XL/2")
        vchitect = build_model("Vchitect-XL")
    assert isinstance(stdit, STDiT) and isinstance(vchitect, VchitectXL)
    assert (len(stdit.blocks), stdit.hidden_size, stdit.num_heads, stdit.patch_size) == (28, 1152, 16, (1, 2, 2))
    assert stdit.y_embedder.y_proj.fc1.in_features == 4096
    assert 0.70e9 < sum(p.numel() for p in stdit.parameters()) < 0.80e9
    assert (len(vchitect.blocks), vchitect.hidden_size, vchitect.num_heads) == (20, 1536, 24)
    assert 1.9e9 < sum(p.numel() for p in vchitect.parameters()) < 2.1e9
    assert vchitect.get_fsdp_wrap_module_list() == list(vchitect.blocks)


def _rope_reference(x, angles):
    """Complex-number RoPE: channel pairs as complex numbers times e^{i * angle}."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())       # [B, N, H, Dh/2]
    rotated = pairs * torch.polar(torch.ones_like(angles), angles)[None, :, None]
    return torch.view_as_real(rotated).flatten(-2)


def test_rope_matches_complex_reference_and_is_relative():
    x = torch.randn(2, 6, 3, 8)
    angles = rope_2d(8, 2, 3)
    torch.testing.assert_close(apply_rope(x, angles), _rope_reference(x, angles))
    # Dot products depend on relative positions only: shift both positions by one frame.
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    table = rope_1d(8, 5)

    def dot(m, n):
        return (apply_rope(q, table[m:m + 1]) * apply_rope(k, table[n:n + 1])).sum()

    torch.testing.assert_close(dot(1, 3), dot(2, 4))
