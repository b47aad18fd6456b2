"""DiT model zoo against an independent reference of Meta's DiT.

The reference here is functional: it reads a state dict laid out like the released checkpoints
and recomputes the forward pass with plain tensor math (patchify, positional table, timestep
sinusoid + MLP, label table, adaLN-Zero blocks with explicit softmax attention, final layer,
unpatchify). The positional tables are checked against numpy code following the reference formula.
"""

import argparse
import math

import numpy as np
import pytest
import torch
from timm.layers import PatchEmbed as TimmPatchEmbed

from opendit_lite.checkpoint.original_dit import load_original_dit_checkpoint
from opendit_lite.models import MODELS, DiT, DiT_models, build_model
from opendit_lite.models.layers import (
    LabelEmbedder,
    PatchEmbed,
    SequenceGather,
    SequenceSplit,
    TimestepEmbedder,
    get_1d_sincos_pos_embed,
    get_2d_sincos_pos_embed,
)

TINY = dict(depth=2, hidden_size=64, num_heads=4, patch_size=2)  # the registered "DiT-T/2"
NUM_CLASSES = 10


def assert_close(actual, expected, atol, what=""):
    """Max-abs-diff check that reports the worst mismatch."""
    diff = (actual.double() - expected.double()).abs().max().item()
    assert diff <= atol, f"{what}: max abs diff {diff:.3e} > {atol:.1e}"


# ----------------------------------------------------------------------------------------------
# Reference positional tables (numpy), following the reference formula and axis order
# ----------------------------------------------------------------------------------------------

def np_sincos_1d(embed_dim, pos):
    omega = np.arange(embed_dim // 2, dtype=np.float64) / (embed_dim / 2.0)
    omega = 1.0 / 10000 ** omega                               # [D/2]
    angles = np.einsum("m,d->md", pos.reshape(-1), omega)      # [M, D/2]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def np_sincos_2d(embed_dim, grid_h, grid_w):
    # The reference builds meshgrid(w, h) and embeds grid[0] (the column index) first.
    grid = np.meshgrid(np.arange(grid_w, dtype=np.float32), np.arange(grid_h, dtype=np.float32))
    grid = np.stack(grid, axis=0).reshape(2, 1, grid_h, grid_w)
    first = np_sincos_1d(embed_dim // 2, grid[0])
    second = np_sincos_1d(embed_dim // 2, grid[1])
    return np.concatenate([first, second], axis=1).astype(np.float32)  # [H*W, D]


# ----------------------------------------------------------------------------------------------
# Reference checkpoint layout and functional forward
# ----------------------------------------------------------------------------------------------

def original_shapes(depth, hidden_size, patch_size, grid, in_channels=4, num_classes=1000,
                    learn_sigma=True):
    """Key -> shape of a reference DiT state dict (with the null class, i.e. dropout > 0)."""
    D, p, C = hidden_size, patch_size, in_channels
    c_out = 2 * C if learn_sigma else C
    shapes = {
        "pos_embed": (1, grid[0] * grid[1], D),
        "x_embedder.proj.weight": (D, C, p, p),
        "x_embedder.proj.bias": (D,),
        "t_embedder.mlp.0.weight": (D, 256),
        "t_embedder.mlp.0.bias": (D,),
        "t_embedder.mlp.2.weight": (D, D),
        "t_embedder.mlp.2.bias": (D,),
        "y_embedder.embedding_table.weight": (num_classes + 1, D),
    }
    for i in range(depth):
        shapes.update({
            f"blocks.{i}.attn.qkv.weight": (3 * D, D),
            f"blocks.{i}.attn.qkv.bias": (3 * D,),
            f"blocks.{i}.attn.proj.weight": (D, D),
            f"blocks.{i}.attn.proj.bias": (D,),
            f"blocks.{i}.mlp.fc1.weight": (4 * D, D),
            f"blocks.{i}.mlp.fc1.bias": (4 * D,),
            f"blocks.{i}.mlp.fc2.weight": (D, 4 * D),
            f"blocks.{i}.mlp.fc2.bias": (D,),
            f"blocks.{i}.adaLN_modulation.1.weight": (6 * D, D),
            f"blocks.{i}.adaLN_modulation.1.bias": (6 * D,),
        })
    shapes.update({
        "final_layer.linear.weight": (p * p * c_out, D),
        "final_layer.linear.bias": (p * p * c_out,),
        "final_layer.adaLN_modulation.1.weight": (2 * D, D),
        "final_layer.adaLN_modulation.1.bias": (2 * D,),
    })
    return shapes


def random_original_state_dict(shapes, grid, seed=0):
    """Random weights of a sensible scale for every key (adaLN included, so nothing is trivially 0)."""
    gen = torch.Generator().manual_seed(seed)
    sd = {}
    for key, shape in shapes.items():
        if key == "pos_embed":
            sd[key] = torch.from_numpy(np_sincos_2d(shape[-1], *grid)).unsqueeze(0)
        elif len(shape) == 1:
            sd[key] = 0.1 * torch.randn(shape, generator=gen)
        else:
            fan_in = math.prod(shape[1:])
            sd[key] = torch.randn(shape, generator=gen) / math.sqrt(fan_in)
    return sd


def ref_linear(sd, name, x):
    return x @ sd[f"{name}.weight"].t() + sd[f"{name}.bias"]


def ref_layer_norm(x, eps=1e-6):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps)


def ref_silu(x):
    return x * torch.sigmoid(x)


def ref_gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_timestep_features(t, dim=256, max_period=10000):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # cos first


def ref_dit_forward(sd, x, t, y, patch_size, num_heads, out_channels):
    B, C, H, W = x.shape
    p = patch_size
    h, w = H // p, W // p
    D = sd["pos_embed"].shape[-1]
    depth = len([k for k in sd if k.endswith("adaLN_modulation.1.weight") and k.startswith("blocks.")])

    # Patchify: a stride-p conv is a linear map on each patch flattened in (channel, row, col) order.
    patches = x.reshape(B, C, h, p, w, p).permute(0, 2, 4, 1, 3, 5).reshape(B, h * w, C * p * p)
    tokens = patches @ sd["x_embedder.proj.weight"].reshape(D, -1).t() + sd["x_embedder.proj.bias"]
    tokens = tokens + sd["pos_embed"]

    t_hidden = ref_silu(ref_linear(sd, "t_embedder.mlp.0", ref_timestep_features(t)))
    t_emb = ref_linear(sd, "t_embedder.mlp.2", t_hidden)
    c = t_emb + sd["y_embedder.embedding_table.weight"][y]
    c_act = ref_silu(c)

    heads, dh = num_heads, D // num_heads
    for i in range(depth):
        pre = f"blocks.{i}."
        mods = ref_linear(sd, pre + "adaLN_modulation.1", c_act).reshape(B, 6, 1, D).unbind(1)
        shift1, scale1, gate1, shift2, scale2, gate2 = mods

        a_in = ref_layer_norm(tokens) * (1 + scale1) + shift1
        qkv = ref_linear(sd, pre + "attn.qkv", a_in).reshape(B, h * w, 3, heads, dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)
        a_out = (att @ v).transpose(1, 2).reshape(B, h * w, D)
        tokens = tokens + gate1 * ref_linear(sd, pre + "attn.proj", a_out)

        m_in = ref_layer_norm(tokens) * (1 + scale2) + shift2
        m_out = ref_linear(sd, pre + "mlp.fc2", ref_gelu_tanh(ref_linear(sd, pre + "mlp.fc1", m_in)))
        tokens = tokens + gate2 * m_out

    shift, scale = ref_linear(sd, "final_layer.adaLN_modulation.1", c_act).reshape(B, 2, 1, D).unbind(1)
    out = ref_linear(sd, "final_layer.linear", ref_layer_norm(tokens) * (1 + scale) + shift)
    # Unpatchify: each token holds its patch as (row, col, channel).
    out = out.reshape(B, h, w, p, p, out_channels).permute(0, 5, 1, 3, 2, 4)
    return out.reshape(B, out_channels, H, W)


def tiny_dit(input_size=8, **kwargs):
    kwargs.setdefault("num_classes", NUM_CLASSES)
    return build_model("DiT-T/2", input_size=input_size, **kwargs)


def grid_of(input_size, patch_size=2):
    h, w = (input_size, input_size) if isinstance(input_size, int) else input_size
    return h // patch_size, w // patch_size


def loaded_tiny_dit(input_size, seed=0):
    """Tiny DiT holding random reference-layout weights; returns (model, state dict)."""
    grid = grid_of(input_size)
    sd = random_original_state_dict(
        original_shapes(TINY["depth"], TINY["hidden_size"], TINY["patch_size"], grid,
                        num_classes=NUM_CLASSES),
        grid, seed=seed,
    )
    model = tiny_dit(input_size)
    model.load_state_dict(sd, strict=True)
    return model, sd


def inputs(input_size, batch=3, seed=1):
    h, w = (input_size, input_size) if isinstance(input_size, int) else input_size
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, h, w, generator=gen)
    t = torch.tensor([0, 37, 999, 500, 1, 250][:batch])
    y = torch.tensor([3, 0, NUM_CLASSES, 9, 1, 5][:batch])  # includes the null class
    return x, t, y


# ----------------------------------------------------------------------------------------------
# Embeddings
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("embed_dim,grid", [(64, (4, 4)), (32, (3, 5)), (16, (6, 2)), (1152, (16, 16))])
def test_2d_sincos_pos_embed_matches_numpy_reference(embed_dim, grid):
    expected = torch.from_numpy(np_sincos_2d(embed_dim, *grid))
    size = grid[0] if grid[0] == grid[1] else grid
    actual = get_2d_sincos_pos_embed(embed_dim, size)
    assert actual.shape == (grid[0] * grid[1], embed_dim) and actual.dtype == torch.float32
    assert_close(actual, expected, 1e-6, "2D pos embed")


def test_1d_sincos_pos_embed_matches_numpy_reference():
    expected = torch.from_numpy(np_sincos_1d(96, np.arange(17, dtype=np.float32)).astype(np.float32))
    assert_close(get_1d_sincos_pos_embed(96, 17), expected, 1e-6, "1D pos embed")


def test_sincos_pos_embed_rejects_bad_dims():
    with pytest.raises(ValueError, match="divisible by 4"):
        get_2d_sincos_pos_embed(6, 4)
    with pytest.raises(ValueError, match="even embed_dim"):
        get_1d_sincos_pos_embed(7, 4)
    with pytest.raises(ValueError, match="pair of ints"):
        get_2d_sincos_pos_embed(8, (2, 3, 4))


@pytest.mark.parametrize("dim", [256, 33])
def test_timestep_embedding_is_cos_then_sin(dim):
    t = torch.tensor([0.0, 1.0, 10.5, 999.0])
    actual = TimestepEmbedder.timestep_embedding(t, dim)
    expected = ref_timestep_features(t, dim - dim % 2)
    assert actual.shape == (4, dim)
    assert_close(actual[:, : dim - dim % 2], expected, 1e-6, "timestep features")
    if dim % 2:
        assert torch.all(actual[:, -1] == 0)
    # Independent float64 check of the layout (loose: float32 angles at t = 999).
    half = dim // 2
    ang = t.double()[:, None] * 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    assert_close(actual[:, :half], torch.cos(ang), 2e-4, "cos half")
    assert_close(actual[:, half:2 * half], torch.sin(ang), 2e-4, "sin half")


def test_patch_embed_matches_timm_layout_and_output():
    ours = PatchEmbed(img_size=(8, 12), patch_size=2, in_chans=4, embed_dim=16)
    timm_layer = TimmPatchEmbed(img_size=(8, 12), patch_size=2, in_chans=4, embed_dim=16)
    assert set(ours.state_dict()) == set(timm_layer.state_dict())
    ours.load_state_dict(timm_layer.state_dict(), strict=True)
    assert ours.grid_size == (4, 6) and ours.num_patches == 24
    x = torch.randn(2, 4, 8, 12)
    assert_close(ours(x), timm_layer(x), 1e-6, "patch embed")
    with pytest.raises(ValueError, match=r"expects input \[B, 4, 8, 12\]"):
        ours(torch.randn(2, 4, 12, 8))
    with pytest.raises(ValueError, match="divisible by patch_size"):
        PatchEmbed(img_size=(8, 9), patch_size=2)


def test_label_embedder_dropout_uses_null_class():
    emb = LabelEmbedder(NUM_CLASSES, 8, dropout_prob=1.0)
    labels = torch.tensor([0, 4, 9])
    null_row = emb.embedding_table.weight[NUM_CLASSES]
    assert emb.embedding_table.num_embeddings == NUM_CLASSES + 1
    assert torch.equal(emb(labels, train=True), null_row.expand(3, 8))           # always dropped
    assert torch.equal(emb(labels, train=False), emb.embedding_table.weight[labels])  # eval: no dropout
    forced = emb(labels, train=False, force_drop_ids=torch.tensor([0, 1, 0]))
    assert torch.equal(forced[1], null_row) and torch.equal(forced[0], emb.embedding_table.weight[0])

    no_cfg = LabelEmbedder(NUM_CLASSES, 8, dropout_prob=0.0)
    assert no_cfg.embedding_table.num_embeddings == NUM_CLASSES                  # no null row
    assert torch.equal(no_cfg(labels, train=True), no_cfg.embedding_table.weight[labels])
    with pytest.raises(ValueError, match="null class"):
        no_cfg(labels, train=False, force_drop_ids=torch.tensor([1, 0, 0]))


# ----------------------------------------------------------------------------------------------
# DiT against the functional reference
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("input_size", [8, (8, 12), (12, 4)])
def test_dit_matches_functional_reference(input_size):
    model, sd = loaded_tiny_dit(input_size)
    model.eval()
    x, t, y = inputs(input_size)
    out = model(x, t, y)

    ref_sd = {k: v.clone().requires_grad_(k != "pos_embed") for k, v in sd.items()}
    ref = ref_dit_forward(ref_sd, x, t, y, patch_size=2, num_heads=TINY["num_heads"], out_channels=8)
    assert out.shape == ref.shape == (3, 8, *x.shape[-2:])
    assert ref.abs().max() > 0.1  # the comparison is not between two near-zero tensors
    assert_close(out, ref, 1e-5, f"DiT forward, input_size={input_size}")

    # Every trainable parameter's gradient agrees too.
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    (out * weight).sum().backward()
    (ref * weight).sum().backward()
    for name, param in model.named_parameters():
        if name == "pos_embed":
            assert not param.requires_grad and param.grad is None
            continue
        assert_close(param.grad, ref_sd[name].grad, 1e-4, f"grad of {name}")


def test_bf16_model_runs_and_tracks_fp32():
    # The timestep features are float32 by construction and must be cast to the MLP's dtype.
    model, _ = loaded_tiny_dit(8)
    model.eval()
    x, t, y = inputs(8)
    expected = model(x, t, y)
    out = model.to(torch.bfloat16)(x.bfloat16(), t, y)
    assert out.dtype == torch.bfloat16
    assert_close(out.float(), expected, 0.1, "bf16 vs fp32 forward")  # outputs are O(1); bf16 ~1e-2


def test_default_init_predicts_zero_and_uses_reference_pos_embed():
    model = tiny_dit((8, 12))
    x, t, y = inputs((8, 12))
    assert torch.equal(model(x, t, y), torch.zeros(3, 8, 8, 12))  # adaLN-Zero + zero final layer
    expected = torch.from_numpy(np_sincos_2d(64, 4, 6)).unsqueeze(0)
    assert_close(model.pos_embed, expected, 1e-6, "initial pos_embed")
    for block in model.blocks:
        assert torch.count_nonzero(block.adaLN_modulation[-1].weight) == 0
        assert torch.count_nonzero(block.attn.qkv.weight) > 0


def test_forward_rejects_wrong_spatial_size():
    model = tiny_dit(8)
    x, t, y = inputs(12)
    with pytest.raises(ValueError, match=r"expects input \[B, 4, 8, 8\].*input_size"):
        model(x, t, y)


def test_variable_size_dit_equals_a_dit_built_for_each_size():
    """variable_size=True: any (non-square) size gives what a DiT built for that size gives with the
    same weights (their tables are the same sine-cosine function of the patch grid)."""
    torch.manual_seed(0)
    model = tiny_dit(8, variable_size=True).eval()
    for name, p in model.named_parameters():
        if name != "pos_embed":  # the fixed table stays the sine-cosine one
            torch.nn.init.normal_(p, std=0.05)
    for size in [(8, 8), (8, 12), (12, 4)]:
        fixed = tiny_dit(size).eval()
        fixed.load_state_dict({k: v for k, v in model.state_dict().items() if k != "pos_embed"}, strict=False)
        x, t, y = inputs(size)
        out = model(x, t, y)
        assert out.shape[-2:] == size
        assert_close(out, fixed(x, t, y), 1e-5, f"variable-size DiT at {size}")
    with pytest.raises(ValueError, match="not divisible by the patch"):
        model(*inputs((8, 9)))


@pytest.mark.parametrize("guidance_channels", [None, 4])
def test_forward_with_cfg(guidance_channels):
    model, _ = loaded_tiny_dit((8, 12))
    model.eval()
    x, _, _ = inputs((8, 12), batch=4)
    t = torch.tensor([10, 400, 10, 400])
    y = torch.tensor([2, 7, NUM_CLASSES, NUM_CLASSES])  # [conditional; null]
    scale = 4.0
    kwargs = {} if guidance_channels is None else {"guidance_channels": guidance_channels}
    out = model.forward_with_cfg(x, t, y, scale, **kwargs)

    g = 3 if guidance_channels is None else guidance_channels  # the reference guides 3 channels
    raw = model(torch.cat([x[:2], x[:2]]), t, y)              # second half of x is ignored
    guided = raw[2:, :g] + scale * (raw[:2, :g] - raw[2:, :g])
    assert_close(out[:2, :g], guided, 1e-5, "guided channels, conditional half")
    assert_close(out[2:, :g], guided, 1e-5, "guided channels, unconditional half")
    assert torch.equal(out[:, g:], raw[:, g:])
    with pytest.raises(ValueError, match="doubled batch"):
        model.forward_with_cfg(x[:3], t[:3], y[:3], scale)
    with pytest.raises(ValueError, match="guidance channels must be in"):
        model.forward_with_cfg(x, t, y, scale, guidance_channels=9)


def test_label_dropout_in_train_mode_uses_null_class():
    model, sd = loaded_tiny_dit(8)
    model.y_embedder.dropout_prob = 1.0  # drop every label
    x, t, y = inputs(8)
    model.train()
    dropped = model(x, t, y)
    model.eval()
    null = model(x, t, torch.full_like(y, NUM_CLASSES))
    conditional = model(x, t, y)
    assert_close(dropped, null, 1e-6, "train-mode dropout vs null class")
    assert not torch.allclose(conditional, null)


# ----------------------------------------------------------------------------------------------
# Configurations, parameter counts, checkpoint layout
# ----------------------------------------------------------------------------------------------

ORIGINAL_NAMES = ["DiT-XL/2", "DiT-XL/4", "DiT-XL/8", "DiT-L/2", "DiT-L/4", "DiT-L/8",
                  "DiT-B/2", "DiT-B/4", "DiT-B/8", "DiT-S/2", "DiT-S/4", "DiT-S/8"]
SIZES = {"XL": (28, 1152, 16), "L": (24, 1024, 16), "B": (12, 768, 12), "S": (12, 384, 6)}


def test_dit_models_table_matches_original():
    assert list(DiT_models) == ORIGINAL_NAMES
    assert "DiT-T/2" in MODELS and "DiT-T/2" not in DiT_models
    for name in ORIGINAL_NAMES:
        assert MODELS[name] is DiT_models[name]
        size, patch = name[len("DiT-"):].split("/")
        depth, hidden, heads = SIZES[size]
        with torch.device("meta"):  # shapes only: builds in milliseconds without allocating
            model = DiT_models[name]()
        assert isinstance(model, DiT)
        assert len(model.blocks) == depth and model.pos_embed.shape[-1] == hidden
        assert model.blocks[0].attn.num_heads == heads and model.patch_size == int(patch)
        assert model.pos_embed.shape[1] == (32 // int(patch)) ** 2


def test_dit_xl_2_parameter_count_and_original_key_layout():
    # Parameter shapes do not depend on the device, so the meta build gives the exact counts.
    with torch.device("meta"):
        model = DiT_models["DiT-XL/2"](input_size=32, in_channels=4, learn_sigma=True)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert total == 675_129_632
    assert trainable == 674_834_720  # everything but the frozen 256 x 1152 pos_embed
    expected = original_shapes(28, 1152, 2, (16, 16))
    assert sum(math.prod(s) for s in expected.values()) == total  # the test's table is the reference's
    actual = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert actual == expected


@pytest.mark.parametrize("input_size", [8, (8, 12)])
def test_tiny_state_dict_layout_and_strict_load(input_size):
    model = tiny_dit(input_size)
    expected = original_shapes(2, 64, 2, grid_of(input_size), num_classes=NUM_CLASSES)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
    model.load_state_dict(random_original_state_dict(expected, grid_of(input_size)), strict=True)


def test_structure_for_parallelism():
    model = tiny_dit(8)
    assert DiT.supports_gradient_checkpointing is True
    wrap = model.get_fsdp_wrap_module_list()
    assert len(wrap) == 2 and all(a is b for a, b in zip(wrap, model.blocks))
    assert isinstance(model.seq_split, SequenceSplit) and isinstance(model.seq_gather, SequenceGather)
    assert not model.pos_embed.requires_grad


# ----------------------------------------------------------------------------------------------
# Loading reference checkpoints
# ----------------------------------------------------------------------------------------------

def test_load_original_checkpoint_plain_and_training_layouts(tmp_path):
    source, sd = loaded_tiny_dit(8, seed=3)
    _, other_sd = loaded_tiny_dit(8, seed=4)
    x, t, y = inputs(8)
    source.eval()
    expected = source(x, t, y)

    plain = tmp_path / "plain.pt"
    torch.save(sd, plain)
    training = tmp_path / "training.pt"  # what the reference train.py writes
    opt = torch.optim.AdamW(tiny_dit(8).parameters(), lr=1e-4)
    torch.save({"model": other_sd, "ema": sd, "opt": opt.state_dict(),
                "args": argparse.Namespace(model="DiT-T/2", image_size=64)}, training)

    for checkpoint in (plain, str(training), {"model": sd}, sd):
        model = load_original_dit_checkpoint(tiny_dit(8), checkpoint).eval()
        assert_close(model(x, t, y), expected, 0.0, f"after loading {type(checkpoint).__name__}")


def test_load_original_checkpoint_names_bad_keys():
    _, sd = loaded_tiny_dit(8)
    bad = dict(sd)
    del bad["blocks.1.mlp.fc2.bias"]
    bad["blocks.2.attn.qkv.weight"] = torch.zeros(3)
    bad["pos_embed"] = torch.zeros(1, 64, 64)
    with pytest.raises(ValueError) as err:
        load_original_dit_checkpoint(tiny_dit(8), bad)
    message = str(err.value)
    assert "missing keys: blocks.1.mlp.fc2.bias" in message
    assert "unexpected keys: blocks.2.attn.qkv.weight" in message
    assert "pos_embed (checkpoint [1, 64, 64], model [1, 16, 64])" in message
