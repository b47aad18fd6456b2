"""Weight-initialisation steps shared by the zoo's transformers (DiT's recipe, reused by the video models)."""

import torch.nn as nn


def init_linears_xavier(model: nn.Module) -> None:
    """Every nn.Linear of ``model``: xavier-uniform weight, zero bias."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def init_patch_embed(proj: nn.Module) -> None:
    """A patchifying convolution initialised as the per-patch linear map it is: xavier on its kernel
    viewed as [D, C * prod(patch)], so fan-in/fan-out are those of that linear map; zero bias."""
    weight = proj.weight
    nn.init.xavier_uniform_(weight.view(weight.shape[0], -1))
    nn.init.zeros_(proj.bias)
