"""Video VAE helpers (sliced, DP, compiled) and the sharded text encoder equal the plain computation,
on tiny randomly initialised AutoencoderKL / T5EncoderModel / CLIPTextModel built here."""

import pytest
import torch
import torch.distributed as dist

from opendit_lite.encoders.text import TextEncoder, shard_text_encoder
from opendit_lite.encoders.video_vae import VideoVAE, compile_encode
from tests.distributed import run_distributed


def tiny_vae():
    from diffusers.models import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16),
                         latent_channels=4, norm_num_groups=4, layers_per_block=1).eval()


def tiny_text_model(kind: str):
    import transformers

    torch.manual_seed(0)
    if kind == "t5":
        cfg = transformers.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4)
        return transformers.T5EncoderModel(cfg)
    cfg = transformers.CLIPTextConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, max_position_embeddings=16)
    return transformers.CLIPTextModel(cfg)


def _plain_encode(vae, video):
    """Reference: every frame through the VAE in one call, posterior mean, scaled."""
    B, C, T, H, W = video.shape
    frames = video.permute(0, 2, 1, 3, 4).reshape(B * T, C, H, W)
    z = vae.encode(frames).latent_dist.mode() * 0.18215
    return z.reshape(B, T, *z.shape[1:]).permute(0, 2, 1, 3, 4)


def _video():
    return torch.rand(2, 3, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1


@torch.no_grad()
def test_sliced_encode_and_decode_equal_plain():
    vae, video = tiny_vae(), _video()
    ref = _plain_encode(vae, video)
    z = VideoVAE(vae, micro_batch=4).encode(video)
    assert z.shape == (2, 4, 3, 4, 4)
    torch.testing.assert_close(z, ref, atol=1e-5, rtol=1e-5)
    decoded = VideoVAE(vae, micro_batch=4).decode(z)
    frames = vae.decode(z.permute(0, 2, 1, 3, 4).reshape(6, 4, 4, 4) / 0.18215).sample.clamp(-1, 1)
    torch.testing.assert_close(decoded, frames.reshape(2, 3, 3, 8, 8).permute(0, 2, 1, 3, 4), atol=1e-5, rtol=1e-5)


def test_bad_micro_batch_is_refused():
    with pytest.raises(ValueError, match="micro_batch"):
        VideoVAE(tiny_vae(), micro_batch=0)


@torch.no_grad()
def test_compiled_encode_equals_plain_or_falls_back():
    vae, video = tiny_vae(), _video()
    z = VideoVAE(vae, micro_batch=3, compile=True).encode(video)
    torch.testing.assert_close(z, _plain_encode(vae, video), atol=1e-4, rtol=1e-4)


def test_compile_fallback_runs_eager_when_backend_fails(monkeypatch):
    def broken_compile(fn, **kwargs):
        def run(x):
            raise RuntimeError("no compiler")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    calls = []
    encode = compile_encode(lambda x: calls.append(1) or x * 2)
    with pytest.warns(UserWarning, match="falling back to eager"):
        assert torch.equal(encode(torch.ones(2)), torch.full((2,), 2.0))
    assert encode(torch.ones(1)).item() == 2.0 and len(calls) == 2


def _distributed_checks(rank, world_size):
    torch.manual_seed(0)
    results = {}
    # DP VAE: 6 frames over the group (not divisible by 4), each rank a share, all-gathered.
    vae, video = tiny_vae(), _video()
    with torch.no_grad():
        z = VideoVAE(vae, micro_batch=1, sp_group=dist.group.WORLD).encode(video)
        results["dp_vae"] = (z - _plain_encode(vae, video)).abs().max().item()
    # Sharded text encoders: same states as the unsharded one, with 1/P of the parameters resident.
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    for kind in ("t5", "clip"):
        plain = TextEncoder(None, tiny_text_model(kind), max_length=8, kind=kind)
        ref = plain.encode_ids(ids, mask)
        sharded = shard_text_encoder(TextEncoder(None, tiny_text_model(kind), max_length=8, kind=kind))
        resident = sum(s.shard.numel() for s in sharded.sharded)
        total = sum(p.numel() for p in tiny_text_model(kind).parameters())
        results[kind] = ((sharded.encode_ids(ids, mask) - ref).abs().max().item(), resident / total)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [4])
def test_dp_vae_and_sharded_text_encoder_equal_plain(world_size):
    for rank, results in enumerate(run_distributed(_distributed_checks, world_size)):
        assert results["dp_vae"] < 1e-5, f"rank {rank}: DP VAE differs by {results['dp_vae']}"
        for kind in ("t5", "clip"):
            err, fraction = results[kind]
            assert err == 0, f"rank {rank}: sharded {kind} encoder differs by {err}"
            assert fraction < 1.01 / world_size, f"rank {rank}: {kind} keeps {fraction:.2f} of its parameters"
