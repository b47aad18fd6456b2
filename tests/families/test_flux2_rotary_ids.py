"""FLUX.2's rotary ids are ``Flux2Pipeline``'s own (``_prepare_text_ids``, ``_prepare_latent_ids``), built once
per batch shape and device, and the ``model.path`` adapter's forward passes those (it rebuilt them by hand
at every call)."""

import torch
from diffusers import Flux2Pipeline

from opendit_lite.families import family_adapter
from opendit_lite.families.flux2.adapter import rotary_ids
from tests import diffusers_families as families


def test_the_ids_are_the_pipeline_s_built_once_per_shape():
    txt_ids, img_ids = rotary_ids(2, 7, 3, 5, torch.device("cpu"))
    assert torch.equal(txt_ids, Flux2Pipeline._prepare_text_ids(torch.zeros(2, 7, 8)))        # (0, 0, 0, l)
    assert torch.equal(img_ids, Flux2Pipeline._prepare_latent_ids(torch.zeros(2, 4, 3, 5)))   # (0, row, column, 0)
    again = rotary_ids(2, 7, 3, 5, torch.device("cpu"))
    assert again[0] is txt_ids and again[1] is img_ids


def test_the_adapter_s_forward_passes_the_pipeline_s_ids():
    model = families.build("Flux2Transformer2DModel")
    seen = {}
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.update(kwargs) and None, with_kwargs=True)
    C = model.config.in_channels
    x, states = torch.randn(2, C, 1, 3, 5), torch.randn(2, 7, model.config.joint_attention_dim)
    family_adapter(model).forward(model, model.config, x, torch.rand(2) * 1000, states, None, None)
    assert torch.equal(seen["txt_ids"], Flux2Pipeline._prepare_text_ids(states))
    assert torch.equal(seen["img_ids"], Flux2Pipeline._prepare_latent_ids(x[:, :, 0]))
