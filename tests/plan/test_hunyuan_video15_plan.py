"""The planner counts a family's activations from a forward on the meta device. HunyuanVideo 1.5's own
forward reads its inputs' values (whether the image states are all zero, its text tokens selected by
mask), so its adapter gives ``counting_forward``, the same computation with the selection done by shape:
here it equals the adapter's forward (output and every gradient) on the CPU, and the planner counts the
model with it (tests/plan/test_family_activations.py checks the count's predictions within 15%). A
family whose forward reads values and gives no such forward is still refused with a ConfigError (exit 2).
"""

import pytest
import torch

from opendit_lite.errors import ConfigError
from opendit_lite.families import FamilyDenoiser, family_adapter
from opendit_lite.families.adapter_base import FamilyAdapter
from opendit_lite.plan.from_config import family_shape
from tests import diffusers_families as fam

NAME = "HunyuanVideo15Transformer3DModel"


def meta_model():
    from diffusers import HunyuanVideo15Transformer3DModel

    with torch.device("meta"):
        return HunyuanVideo15Transformer3DModel(**fam.CONFIGS[NAME])


def test_counting_forward_is_the_forward_and_the_planner_counts_it():
    model = fam.build(NAME)
    adapter = family_adapter(model)
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(2, 4, 3, 4, 6, generator=g), torch.rand(2, generator=g) * 999    # [B, C, T, H, W], [B]
    y, mask = torch.randn(2, 6, 32, generator=g), torch.ones(2, 6, dtype=torch.bool)  # the planner's: all valid
    results = []
    for counting in (False, True):
        model.zero_grad()
        out = FamilyDenoiser(adapter, model, model.config, 6, 32, counting=counting)(x, t, y, mask)
        out.square().mean().backward()
        results.append((out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (ref, ref_grads), (got, grads) = results
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-6, atol=1e-7, msg=n)

    shape = family_shape(meta_model(), 8)
    assert shape.profile.token_widths > 0 and "counted from the model's forward" in shape.profile.source


def test_a_forward_reading_values_without_a_counting_forward_is_refused(monkeypatch):
    adapter = family_adapter(NAME)
    monkeypatch.setattr(type(adapter), "counting_forward", FamilyAdapter.counting_forward)
    with pytest.raises(ConfigError, match="forward reads its inputs' values .* cannot plan this model yet"):
        family_shape(meta_model(), 8)
