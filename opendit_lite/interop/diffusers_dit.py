"""Our DiT <-> diffusers' ``DiTTransformer2DModel``: the weight mapping, both directions.

    transformer = to_diffusers_dit(model)                  # a DiTTransformer2DModel; save_pretrained it
    model = from_diffusers_dit(transformer)                # our DiT, ready to fine-tune

The two compute the same function except for one detail (below); the mapping is exact:

==========================================  ==============================================================
ours                                        diffusers
==========================================  ==============================================================
x_embedder.proj                             pos_embed.proj (the sin-cos table is recomputed, not stored)
t_embedder.mlp.0 / .2                       transformer_blocks.<i>.norm1.emb.timestep_embedder.linear_1 / 2
y_embedder.embedding_table                  transformer_blocks.<i>.norm1.emb.class_embedder.embedding_table
blocks.<i>.adaLN_modulation.1               transformer_blocks.<i>.norm1.linear (same 6-chunk order)
blocks.<i>.attn.qkv (q, k, v stacked)       transformer_blocks.<i>.attn1.to_q / to_k / to_v
blocks.<i>.attn.proj                        transformer_blocks.<i>.attn1.to_out.0
blocks.<i>.mlp.fc1 / fc2                    transformer_blocks.<i>.ff.net.0.proj / ff.net.2
final_layer.adaLN_modulation.1 / linear     proj_out_1 / proj_out_2
==========================================  ==============================================================

diffusers keeps one copy of the timestep and label embedders per block (block 0's also conditions
the final layer); export writes ours into every block, import requires the copies to agree.
diffusers' label table always has the null-class row; a model trained without label dropout gets
a zero row there.

Timestep frequencies. Meta's DiT (and ours by default) embeds t with frequencies
``exp(-ln(10^4) * i / 128)``; diffusers' ``Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1)``
in ``CombinedTimestepLabelEmbeddings`` divides by 127 instead of 128. With exactly mapped weights the
outputs of the two models therefore differ (measured on a 2-block, 64-wide DiT with perturbed
random weights: 0.07 to 0.10 largest absolute difference for outputs of magnitude 1.4 to 1.5, over
timesteps 0..999; ``timestep_frequency_mismatch`` measures it for any model, e.g. a trained one).
The config of ``DiTTransformer2DModel`` does not expose that setting, so a folder cannot carry it.
Two ways to exactness:

* train with diffusers' spacing (``DiT(timestep_spacing="diffusers")``, the config's
  ``model.timestep_spacing: diffusers``): a plain ``from_pretrained`` of the export is then the model;
* after loading, ``use_meta_timestep_frequencies(transformer)`` sets ``downscale_freq_shift = 0``
  on every block's ``Timesteps`` module (a Python call, not saved with the folder).

``scripts/export_diffusers.py`` measures the difference on the weights it exports and refuses an
inexact export unless asked. ``from_diffusers_dit`` builds our DiT with the spacing the diffusers
model uses, so an import is exact either way.

diffusers' DiT is square (``sample_size``) and its norms use ``norm_eps`` (exported as 1e-6, Meta's).
"""

from typing import Dict

import torch
import torch.nn as nn

from opendit_lite.errors import ConfigError
from opendit_lite.models.layers.embeddings import get_2d_sincos_pos_embed


def _block_count(state: Dict[str, torch.Tensor], prefix: str) -> int:
    indices = {int(k[len(prefix):].split(".")[0]) for k in state if k.startswith(prefix)}
    return max(indices) + 1 if indices else 0


def diffusers_dit_config(model: nn.Module) -> dict:
    """``DiTTransformer2DModel`` constructor arguments for our ``DiT`` ``model``."""
    height, width = model.x_embedder.img_size
    if height != width:
        raise ConfigError(f"diffusers' DiTTransformer2DModel is square; this DiT takes {height}x{width} latents")
    hidden = model.pos_embed.shape[-1]
    table = get_2d_sincos_pos_embed(hidden, model.x_embedder.grid_size, device=model.pos_embed.device)
    if not torch.allclose(model.pos_embed[0].float(), table.float(), atol=1e-6):
        raise ConfigError("this DiT's pos_embed is not the fixed sin-cos table diffusers recomputes on load; "
                          "it cannot be exported without changing the model")
    mlp_hidden = model.blocks[0].mlp.fc1.out_features
    if mlp_hidden != 4 * hidden:
        raise ConfigError(f"diffusers' DiT has an MLP of 4 x hidden size; this DiT has mlp_ratio {mlp_hidden / hidden}")
    return dict(
        num_attention_heads=model.num_heads, attention_head_dim=hidden // model.num_heads,
        in_channels=model.in_channels, out_channels=model.out_channels, num_layers=len(model.blocks),
        sample_size=height, patch_size=model.patch_size, num_embeds_ada_norm=model.y_embedder.num_classes,
        attention_bias=True, activation_fn="gelu-approximate", norm_type="ada_norm_zero",
        norm_elementwise_affine=False, norm_eps=1e-6,
    )


def dit_to_diffusers_state_dict(state: Dict[str, torch.Tensor], num_classes: int) -> Dict[str, torch.Tensor]:
    """Our DiT's state dict -> ``DiTTransformer2DModel``'s (see the module docstring)."""
    out = {"pos_embed.proj.weight": state["x_embedder.proj.weight"],
           "pos_embed.proj.bias": state["x_embedder.proj.bias"],
           "proj_out_1.weight": state["final_layer.adaLN_modulation.1.weight"],
           "proj_out_1.bias": state["final_layer.adaLN_modulation.1.bias"],
           "proj_out_2.weight": state["final_layer.linear.weight"],
           "proj_out_2.bias": state["final_layer.linear.bias"]}
    table = state["y_embedder.embedding_table.weight"]                                 # [classes (+1), D]
    if table.shape[0] == num_classes:  # trained without label dropout: add diffusers' null-class row
        table = torch.cat([table, table.new_zeros(1, table.shape[1])])
    for i in range(_block_count(state, "blocks.")):
        ours, theirs = f"blocks.{i}.", f"transformer_blocks.{i}."
        emb = theirs + "norm1.emb."
        for j, name in ((0, "linear_1"), (2, "linear_2")):
            for kind in ("weight", "bias"):
                out[f"{emb}timestep_embedder.{name}.{kind}"] = state[f"t_embedder.mlp.{j}.{kind}"]
        out[emb + "class_embedder.embedding_table.weight"] = table
        for kind in ("weight", "bias"):
            out[f"{theirs}norm1.linear.{kind}"] = state[f"{ours}adaLN_modulation.1.{kind}"]
            q, k, v = state[f"{ours}attn.qkv.{kind}"].chunk(3, dim=0)
            out[f"{theirs}attn1.to_q.{kind}"], out[f"{theirs}attn1.to_k.{kind}"] = q, k
            out[f"{theirs}attn1.to_v.{kind}"] = v
            out[f"{theirs}attn1.to_out.0.{kind}"] = state[f"{ours}attn.proj.{kind}"]
            out[f"{theirs}ff.net.0.proj.{kind}"] = state[f"{ours}mlp.fc1.{kind}"]
            out[f"{theirs}ff.net.2.{kind}"] = state[f"{ours}mlp.fc2.{kind}"]
    return {k: v.clone() for k, v in out.items()}


def diffusers_to_dit_state_dict(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``DiTTransformer2DModel``'s state dict -> ours, without ``pos_embed`` (a fixed table our DiT
    computes; load with ``strict=False`` for it or use ``from_diffusers_dit``)."""
    depth = _block_count(state, "transformer_blocks.")
    emb = "transformer_blocks.0.norm1.emb."
    out = {"x_embedder.proj.weight": state["pos_embed.proj.weight"],
           "x_embedder.proj.bias": state["pos_embed.proj.bias"],
           "final_layer.adaLN_modulation.1.weight": state["proj_out_1.weight"],
           "final_layer.adaLN_modulation.1.bias": state["proj_out_1.bias"],
           "final_layer.linear.weight": state["proj_out_2.weight"],
           "final_layer.linear.bias": state["proj_out_2.bias"],
           "y_embedder.embedding_table.weight": state[emb + "class_embedder.embedding_table.weight"]}
    for j, name in ((0, "linear_1"), (2, "linear_2")):
        for kind in ("weight", "bias"):
            out[f"t_embedder.mlp.{j}.{kind}"] = state[f"{emb}timestep_embedder.{name}.{kind}"]
    for i in range(depth):
        ours, theirs = f"blocks.{i}.", f"transformer_blocks.{i}."
        for suffix in ("timestep_embedder.linear_1.weight", "timestep_embedder.linear_2.weight",
                       "class_embedder.embedding_table.weight"):
            if not torch.equal(state[f"{theirs}norm1.emb.{suffix}"], state[emb + suffix]):
                raise ConfigError(
                    f"block {i} of this diffusers DiT has its own {suffix.split('.')[0]} weights; our DiT shares one "
                    f"timestep and label embedder across blocks, so it cannot represent this model"
                )
        for kind in ("weight", "bias"):
            out[f"{ours}adaLN_modulation.1.{kind}"] = state[f"{theirs}norm1.linear.{kind}"]
            out[f"{ours}attn.qkv.{kind}"] = torch.cat(
                [state[f"{theirs}attn1.to_{x}.{kind}"] for x in ("q", "k", "v")], dim=0)
            out[f"{ours}attn.proj.{kind}"] = state[f"{theirs}attn1.to_out.0.{kind}"]
            out[f"{ours}mlp.fc1.{kind}"] = state[f"{theirs}ff.net.0.proj.{kind}"]
            out[f"{ours}mlp.fc2.{kind}"] = state[f"{theirs}ff.net.2.{kind}"]
    return {k: v.clone() for k, v in out.items()}


def use_meta_timestep_frequencies(transformer: nn.Module) -> nn.Module:
    """Make a diffusers DiT embed timesteps with Meta's frequency spacing (the exact mode), in place."""
    for block in transformer.transformer_blocks:
        block.norm1.emb.time_proj.downscale_freq_shift = 0
    return transformer


def timestep_spacing_of(transformer: nn.Module) -> str:
    """Our ``timestep_spacing`` name for the spacing a diffusers DiT embeds timesteps with."""
    shift = transformer.transformer_blocks[0].norm1.emb.time_proj.downscale_freq_shift
    return "meta" if shift == 0 else "diffusers"


def to_diffusers_dit(model: nn.Module, exact_timesteps: bool = False) -> nn.Module:
    """A ``DiTTransformer2DModel`` with ``model``'s weights (fp32, eval mode). ``exact_timesteps``:
    also apply ``use_meta_timestep_frequencies`` (not saved by ``save_pretrained``)."""
    from diffusers import DiTTransformer2DModel

    transformer = DiTTransformer2DModel(**diffusers_dit_config(model))
    state = {k: v.float() for k, v in model.state_dict().items()}
    missing, unexpected = transformer.load_state_dict(
        dit_to_diffusers_state_dict(state, model.y_embedder.num_classes), strict=False)
    if missing or unexpected:
        raise ConfigError(f"the diffusers DiT does not take these weights: missing {missing}, unexpected {unexpected}")
    if exact_timesteps:
        use_meta_timestep_frequencies(transformer)
    return transformer.eval()


def from_diffusers_dit(transformer: nn.Module, class_dropout_prob: float = 0.1) -> nn.Module:
    """Our ``DiT`` with the weights of a diffusers ``DiTTransformer2DModel`` (for fine-tuning), with
    its timestep spacing (``timestep_spacing_of``): the same outputs."""
    from opendit_lite.models.dit import DiT

    c = transformer.config
    if c.norm_type != "ada_norm_zero" or c.activation_fn != "gelu-approximate":
        raise ConfigError(f"only diffusers DiTs with norm_type ada_norm_zero and gelu-approximate map onto our "
                          f"DiT; this one has {c.norm_type} and {c.activation_fn}")
    model = DiT(input_size=c.sample_size, patch_size=c.patch_size, in_channels=c.in_channels,
                hidden_size=c.num_attention_heads * c.attention_head_dim, depth=c.num_layers,
                num_heads=c.num_attention_heads, class_dropout_prob=class_dropout_prob,
                num_classes=c.num_embeds_ada_norm, learn_sigma=transformer.out_channels == 2 * c.in_channels,
                timestep_spacing=timestep_spacing_of(transformer))
    state = diffusers_to_dit_state_dict({k: v.float() for k, v in transformer.state_dict().items()})
    table = state["y_embedder.embedding_table.weight"]
    rows = model.y_embedder.embedding_table.weight.shape[0]
    state["y_embedder.embedding_table.weight"] = table[:rows]  # no null class without label dropout
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing != ["pos_embed"] or unexpected:
        raise ConfigError(f"our DiT does not take this diffusers DiT's weights: missing {missing}, "
                          f"unexpected {unexpected}")
    return model


@torch.no_grad()
def timestep_frequency_mismatch(model: nn.Module, batch: int = 4, seed: int = 0) -> float:
    """Largest output difference between ``model`` and a plain ``from_pretrained`` of its diffusers
    export (diffusers' default timestep spacing), on random inputs in eval mode: the size of the
    difference the docstring names for a model with Meta's spacing, float rounding with diffusers'."""
    transformer = to_diffusers_dit(model)
    g = torch.Generator().manual_seed(seed)
    height, width = model.x_embedder.img_size
    x = torch.randn(batch, model.in_channels, height, width, generator=g)
    t = torch.randint(0, 1000, (batch,), generator=g)
    y = torch.randint(0, model.y_embedder.num_classes, (batch,), generator=g)
    was_training = model.training
    ours = model.eval()(x, t, y)
    model.train(was_training)
    theirs = transformer(x, timestep=t, class_labels=y, return_dict=False)[0]
    return (ours.float() - theirs).abs().max().item()
