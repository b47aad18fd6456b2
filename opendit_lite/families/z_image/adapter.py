"""Z-Image's adapter (diffusers' ``ZImageTransformer2DModel``): its forward inputs from a clip batch and
its training recipe: flow matching with the shift of its release's scheduler, 3, and logit-normal
training times (the release does not publish its time distribution; SD3's and Flux's is taken).

The transformer takes lists, one entry per sample: the latents as [C, 1, h, w] and the caption
states cut to the caption's real tokens ([L_i, W], no padding; ``ZImagePipeline._encode_prompt``
drops the padding with its mask). Its timestep is the flow time counted from the noise end,
``1 - sigma`` (the pipeline's ``(1000 - t) / 1000``), and its output is the negated velocity
(``x_0 - noise``; the pipeline negates it before the scheduler's step).
"""

from typing import List

import torch

from ..adapter_base import FamilyAdapter, Recipe


def caption_list(states: torch.Tensor, mask: torch.Tensor) -> List[torch.Tensor]:
    """Caption states [B, M, W] and their bool mask [B, M] -> per sample the states of the real tokens
    [L_i, W], as ``ZImagePipeline._encode_prompt`` returns them (``states[i][mask[i]]``; the mask is a
    prefix, as ``encode_text`` pads: one host read of the lengths per batch). On the meta device (the
    planner), whose masks hold no values, every token is kept."""
    if states.is_meta:
        return list(states.unbind(0))
    lengths = mask.sum(dim=1).tolist()                                                   # one host sync
    return [s[:length] for s, length in zip(states, lengths)]


def z_image_time(t: torch.Tensor) -> torch.Tensor:
    """The objective's timestep (sigma x 1000) -> Z-Image's ``t`` input, ``(1000 - t) / 1000`` = 1 - sigma."""
    return (1000 - t) / 1000


class ZImageAdapter(FamilyAdapter):
    """Z-Image: an image model; 1-frame clips [B, C, 1, H, W]; no pooled text. A sample whose mask
    keeps no token (a dropped caption without the encoded null prompt) keeps its first state: the
    model needs one caption token per sample."""

    class_name = "ZImageTransformer2DModel"
    text_width_key = "cap_feat_dim"
    image_only = True

    def attention_heads(self, config):
        return int(config["n_heads"])

    def hidden_size(self, config):
        return int(config["dim"])

    def token_multiple(self, config):
        return 32  # transformer_z_image.SEQ_MULTI_OF: each sample's patches (and caption) padded to it

    def recipe(self, config, tokens):
        # The release's scheduler (FlowMatchEulerDiscreteScheduler, shift 3, no dynamic shifting).
        return Recipe("rflow", "logit-normal", 3.0)

    def patch_size(self, config):
        p = int(config["all_patch_size"][0])
        return int(config["all_f_patch_size"][0]), p, p

    def forward(self, model, config, x, t, states, mask, pooled):
        mask = mask.bool().clone()
        mask[:, 0] |= ~mask.any(dim=1)                                           # at least one token each
        out = model(x=list(x.unbind(0)), t=z_image_time(t), cap_feats=caption_list(states, mask),
                    return_dict=False)[0]                                        # B x [C, 1, H, W]
        return -torch.stack(out)                                                 # [B, C, 1, H, W]
