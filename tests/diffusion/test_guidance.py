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
