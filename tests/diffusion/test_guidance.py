import pytest
import torch

from opendit_lite.diffusion import cfg_model_fn


def labelled_model(calls):
    """Output channel c of sample i: (c + 1) * y_i + x; records the inputs it is called with."""

    def model(x, t, y):
        calls.append((x.clone(), t.clone()))
        scale = torch.arange(1, 9, dtype=x.dtype).view(1, 8, 1, 1)
        return scale * y.view(-1, 1, 1, 1) + x.mean(dim=1, keepdim=True)

    return model


def test_guidance_formula_and_doubled_batch():
    calls = []
    guided = cfg_model_fn(labelled_model(calls), cfg_scale=4.0)
    x = torch.cat([torch.ones(2, 4, 2, 2), torch.full((2, 4, 2, 2), 9.0)])  # second half is ignored
    t = torch.tensor([5, 6, 5, 6])
    y = torch.tensor([1.0, 2.0, 0.0, 0.0])  # conditions then the null condition
    out = guided(x, t, y=y)
    seen_x, seen_t = calls[0]
    assert torch.equal(seen_x, torch.ones(4, 4, 2, 2)) and torch.equal(seen_t, t)

    raw = labelled_model([])(torch.ones(4, 4, 2, 2), t, y)
    cond, uncond = raw[:2, :4], raw[2:, :4]
    expected = uncond + 4.0 * (cond - uncond)
    assert out.shape == (4, 8, 2, 2)
    assert torch.equal(out[:2, :4], expected) and torch.equal(out[2:, :4], expected)
    assert torch.equal(out[:, 4:], raw[:, 4:])  # the variance block stays each half's own


def test_channels_argument_guides_only_the_leading_channels():
    guided = cfg_model_fn(labelled_model([]), cfg_scale=2.0, channels=3)  # DiT's forward_with_cfg
    x, t, y = torch.zeros(2, 4, 1, 1), torch.zeros(2), torch.tensor([1.0, 0.0])
    out = guided(x, t, y=y)
    assert out[0, :3, 0, 0].tolist() == [2.0, 4.0, 6.0]  # 0 + 2 * ((c + 1) - 0)
    assert out[:, 3:, 0, 0].tolist() == [[4.0, 5.0, 6.0, 7.0, 8.0], [0.0] * 5]


def test_scale_one_is_the_conditional_prediction():
    guided = cfg_model_fn(labelled_model([]), cfg_scale=1.0)
    y = torch.tensor([3.0, 0.0])
    out = guided(torch.zeros(2, 4, 1, 1), torch.zeros(2), y=y)
    assert out[1, :4, 0, 0].tolist() == [3.0, 6.0, 9.0, 12.0]


def test_odd_batch_is_rejected():
    with pytest.raises(ValueError, match="doubled batch"):
        cfg_model_fn(labelled_model([]), 4.0)(torch.zeros(3, 4, 1, 1), torch.zeros(3), y=torch.zeros(3))


# --------------------------------------------------------------------------------------------------
# The layout a model declares: "paired" (video models) against a reference written here
# --------------------------------------------------------------------------------------------------

class PairedModel(torch.nn.Module):
    """A caption-conditioned toy with a learned null caption, declaring the paired layout:
    output channel c = (c + 1) * mean(caption . mask) + x."""

    guidance_layout = "paired"

    def __init__(self):
        super().__init__()
        self.null = torch.nn.Parameter(torch.full((1, 3, 2), 0.25))

    def null_caption(self, batch):
        return self.null.expand(batch, -1, -1)

    def forward(self, x, t, y, mask=None):
        weight = torch.ones(y.shape[:2]) if mask is None else mask.float()           # [B, M]
        c = (y.mean(-1) * weight).sum(-1) / weight.sum(-1)                           # [B]
        scale = torch.arange(1, 9, dtype=x.dtype).view(1, 8, 1, 1)
        return scale * c.view(-1, 1, 1, 1) + x.mean(dim=1, keepdim=True) + t.view(-1, 1, 1, 1)


def reference_paired_guidance(model, x, t, y, mask, scale, channels):
    """Two separate calls, conditional and unconditional, then the guidance formula."""
    cond = model(x, t, y, mask)
    uncond = model(x, t, model.null_caption(x.shape[0]), torch.ones_like(mask))
    guided = uncond[:, :channels] + scale * (cond[:, :channels] - uncond[:, :channels])
    return torch.cat([guided, cond[:, channels:]], dim=1)


def test_paired_layout_matches_two_separate_calls():
    model = PairedModel()
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(2, 4, 2, 2, generator=g), torch.tensor([0.3, 0.7])
    y, mask = torch.randn(2, 3, 2, generator=g), torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = cfg_model_fn(model, cfg_scale=3.0)(x, t, y, mask)
    assert out.shape == (2, 8, 2, 2)  # [B] -> [B]
    torch.testing.assert_close(out, reference_paired_guidance(model, x, t, y, mask, 3.0, channels=4))
    out3 = cfg_model_fn(model, cfg_scale=3.0, channels=3)(x, t, y=y, mask=mask)
    torch.testing.assert_close(out3, reference_paired_guidance(model, x, t, y, mask, 3.0, channels=3))


def test_zoo_models_declare_their_layout_and_forward_with_cfg_uses_it():
    from opendit_lite.models import build_model
    from opendit_lite.models.dit import DiT
    from opendit_lite.models.stdit import STDiT
    from opendit_lite.models.vchitect import VchitectXL

    assert (DiT.guidance_layout, STDiT.guidance_layout, VchitectXL.guidance_layout) == ("concat", "paired", "paired")
    model = build_model("DiT-T/2", input_size=4, in_channels=4, num_classes=3).eval()
    x, t, y = torch.randn(4, 4, 4, 4), torch.tensor([1, 2, 1, 2]), torch.tensor([0, 1, 3, 3])
    with torch.no_grad():
        torch.testing.assert_close(model.forward_with_cfg(x, t, y, 2.0),
                                   cfg_model_fn(model, 2.0, channels=3)(x, t, y=y))


def test_an_unknown_layout_is_an_error():
    class Odd(torch.nn.Module):
        guidance_layout = "interleaved"

    with pytest.raises(ValueError, match="guidance_layout is .interleaved."):
        cfg_model_fn(Odd(), 2.0)
