"""The family adapter protocol: what every ``opendit_lite/families/<family>/adapter.py`` implements
(the family's registry record holds an instance, ``registry.family_adapter`` finds it), and the
patch packing that LTX-Video and Flux share.

An adapter maps the project's clip batch (x [B, C, T, H, W], caption states [B, M, W] with their
bool mask [B, M], pooled text [B, P], the objective's timestep [B]) onto the model's own forward
keywords and its output back to [B, C, T, H, W]; it reads the model's diffusers config (a mapping:
``model.config`` or the dict a model is built from), never the class.
"""

from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn


@dataclass(frozen=True)
class Recipe:
    """A family's published training objective: ``objective`` "rflow" (flow matching, times shifted
    by ``shift``) or "vpred" (v-prediction, SNR divided by ``shift``), with training times drawn by
    ``timestep_sampling`` ("uniform" or "logit-normal")."""

    objective: str
    timestep_sampling: str
    shift: float


class FamilyAdapter:
    """One diffusers family. Subclasses set the class attributes and implement ``forward``.

    * ``class_name``: the diffusers class (``model.name`` in a config);
    * ``text_width_key`` / ``pooled_width_key``: the config keys of the caption-state width and of
      the pooled text vector's width (None: the model takes no pooled text);
    * ``image_only``: an image model, trained on 1-frame clips;
    """

    class_name: str = ""
    text_width_key: str = ""
    pooled_width_key: Optional[str] = None
    image_only: bool = False

    def guidance_distilled(self, config: Mapping) -> bool:
        """True when a model of this config takes the guidance scale as an input (distilled from
        classifier-free guidance, e.g. Flux-dev): it has no unconditional branch of its own to run."""
        return False

    def needs_pipeline(self, config: Mapping) -> str:
        """Why a model of this config trains only from its pipeline folder (``model.pipeline``: its
        conditioning encodes inputs a clip batch does not hold, e.g. an image-to-video transformer's
        images), as what to do; "" when ``model.path`` / ``model.config`` can train it."""
        return ""

    def recipe(self, config: Mapping, tokens: int) -> Recipe:
        """The training recipe for clips of ``tokens`` patches (Flux and LTX-Video shift by it)."""
        raise NotImplementedError

    def patch_size(self, config: Mapping) -> Tuple[int, int, int]:
        """(pt, ph, pw): latent frames, rows and columns per token."""
        raise NotImplementedError

    def latent_channels(self, config: Mapping) -> int:
        """Channels of the clips the model denoises (before any packing)."""
        return int(config["in_channels"])

    def attention_heads(self, config: Mapping) -> int:
        """The attention heads of the model's blocks (Ulysses splits them over the ranks)."""
        return int(config["num_attention_heads"])

    def hidden_size(self, config: Mapping) -> int:
        """The width of the model's token stream (heads x head width)."""
        return self.attention_heads(config) * int(config["attention_head_dim"])

    def token_multiple(self, config: Mapping) -> int:
        """The multiple the model pads each sample's image tokens to (1: none)."""
        return 1

    def text_width(self, config: Mapping) -> int:
        return int(config[self.text_width_key])

    def pooled_width(self, config: Mapping) -> Optional[int]:
        return int(config[self.pooled_width_key]) if self.pooled_width_key else None

    def forward(self, model: nn.Module, config: Mapping, x: torch.Tensor, t: torch.Tensor, states: torch.Tensor,
                mask: torch.Tensor, pooled: Optional[torch.Tensor]) -> torch.Tensor:
        """x [B, C, T, H, W], t [B] (the objective's timestep: flow time x 1000, or the integer
        DDPM step), states [B, M, W] (zero where masked), mask [B, M] bool, pooled [B, P] or None
        -> the prediction [B, C, T, H, W]."""
        raise NotImplementedError

    def counting_forward(self, model: nn.Module, config: Mapping, x: torch.Tensor, t: torch.Tensor,
                         states: torch.Tensor, mask: torch.Tensor, pooled: Optional[torch.Tensor]) -> torch.Tensor:
        """``forward`` as the planner's activation count runs it on the meta device (every caption token
        valid): ``forward`` itself unless the model's forward reads its inputs' values (a branch on them,
        a selection by mask), which meta tensors have none of; such a family gives the same computation
        with the selection done by shape (HunyuanVideo 1.5)."""
        return self.forward(model, config, x, t, states, mask, pooled)


def pack_patches(x: torch.Tensor, pt: int, p: int) -> torch.Tensor:
    """[B, C, T, H, W] -> [B, (T/pt)(H/p)(W/p), C pt p p]: tokens in (frame, row, column) order,
    each holding its channels then its patch's (pt, p, p) positions (LTX-Video's and Flux's packing)."""
    B, C, T, H, W = x.shape
    x = x.reshape(B, C, T // pt, pt, H // p, p, W // p, p)
    return x.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7).flatten(1, 3)


def unpack_patches(tokens: torch.Tensor, shape: Tuple[int, ...], pt: int, p: int) -> torch.Tensor:
    """The inverse of ``pack_patches`` for a clip of ``shape`` (B, C, T, H, W)."""
    B, C, T, H, W = shape
    x = tokens.reshape(B, T // pt, H // p, W // p, C, pt, p, p)
    return x.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(B, C, T, H, W)


def last_block_parameters(blocks: str, prefixes: Sequence[str]) -> Callable[[nn.Module], List[str]]:
    """A family's ``unused_parameters`` capability when the last block of the list ``blocks`` updates a
    stream nothing reads after it (the text stream of a joint-attention model that returns image tokens
    only): the names of that block's parameters under ``prefixes``, which autograd never reaches."""
    def unused(model: nn.Module) -> List[str]:
        last = f"{blocks}.{len(getattr(model, blocks)) - 1}."
        return [name for name, _ in model.named_parameters()
                if name.startswith(last) and name[len(last):].startswith(tuple(prefixes))]
    return unused
