"""Ulysses and ring (both video models; USP 2 x 2 at 4 ranks) and DSP (STDiT) give the serial outputs
and, averaged over the SP group, the serial gradients, at several clip shapes (as a bucketed run feeds
them, one model for all): frames (3, 1, 2) and patches per frame (9, 15) not divisible by sp_size,
non-square frames, a 1-frame image, and a padded caption (which the Vchitect model masks: a text
stream in joint attention); and a variable-size DiT under Ulysses at 15, 6 and 21 tokens per image.
STDiT's spatial attention rings over the patches of each frame, its temporal attention stays local;
the Vchitect-style joint attention keeps the caption replicated. Run in the shared spawns of
tests/parallel/spawn.py."""

import pytest
import torch
import torch.distributed as dist

from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results

# (model, sequence-parallel mode)
CASES = [("STDiT-tiny", "ulysses"), ("STDiT-tiny", "dsp"), ("Vchitect-tiny", "ulysses"), ("STDiT-tiny", "ring"),
         ("Vchitect-tiny", "ring")]
CASES_4 = CASES + [("STDiT-tiny", "usp"), ("Vchitect-tiny", "usp")]   # usp: ring 2 x Ulysses 2


def _build(name: str):
    import opendit_lite.models.stdit  # noqa: F401  (registers the models)
    import opendit_lite.models.vchitect  # noqa: F401
    from opendit_lite.models.registry import build_model

    torch.manual_seed(0)
    model = build_model(name, class_dropout_prob=0.0).train()
    # Non-zero zero-initialised outputs, so every branch contributes to output and gradients.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


# (T, H, W) latent clip shapes: 3 frames of 3x3 patches, an image of 3x5, 2 frames of 5x3.
SHAPES = [(3, 6, 6), (1, 6, 10), (2, 10, 6)]


def _inputs(shape=SHAPES[0]):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, *shape, generator=g)
    t = torch.tensor([10.0, 700.0])
    y = torch.randn(2, 8, 32, generator=g)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, 5:] = False                                      # a padded caption
    return x, t, y, mask


def _loss(out: torch.Tensor) -> torch.Tensor:
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)  # not symmetric: every output matters
    return (out * weights).sum()


def _compare(rank, world_size):
    from opendit_lite.parallel import apply_sequence_parallel
    from opendit_lite.parallel.dsp import apply_dsp

    results = {}
    for name, mode in CASES if world_size == 2 else CASES_4:
        serial, model = _build(name), _build(name)
        if mode == "dsp":
            apply_dsp(model, dist.group.WORLD)
        else:
            apply_sequence_parallel(model, dist.group.WORLD, mode=mode, ring_size=2 if mode == "usp" else None)
        for shape in SHAPES:  # one model, a new shape each step (forward and backward before the next)
            x, t, y, mask = _inputs(shape)
            serial.zero_grad()
            model.zero_grad()
            ref = serial(x, t, y, mask)
            _loss(ref).backward()
            out = model(x, t, y, mask)
            _loss(out).backward()
            grad_err = 0.0
            for (pname, p), q in zip(model.named_parameters(), serial.parameters()):
                if q.grad is None:  # the null caption, unused without caption dropout
                    assert p.grad is None, pname
                    continue
                grad = p.grad.clone()
                dist.all_reduce(grad)
                grad_err = max(grad_err, (grad / world_size - q.grad).abs().max().item())
            results[f"{name}/{mode}/{shape}"] = ((out - ref).abs().max().item(), grad_err)
    # DiT with variable_size=True under Ulysses at image sizes of 15, 6 and 21 tokens.
    from opendit_lite.models.registry import build_model

    dits = []
    for _ in range(2):
        torch.manual_seed(0)
        dits.append(build_model("DiT-T/2", input_size=6, variable_size=True, num_classes=10, class_dropout_prob=0.0))
    serial, model = dits
    with torch.no_grad():
        for a, b in zip(serial.parameters(), model.parameters()):
            a.add_(torch.randn_like(a) * 0.02)
            b.copy_(a)
    apply_sequence_parallel(model, dist.group.WORLD)
    for size in [(10, 6), (4, 6), (6, 14)]:
        g = torch.Generator().manual_seed(2)
        x, t, labels = torch.randn(2, 4, *size, generator=g), torch.tensor([5.0, 600.0]), torch.tensor([1, 7])
        serial.zero_grad()
        model.zero_grad()
        ref, out = serial(x, t, labels), model(x, t, labels)
        _loss(ref).backward()
        _loss(out).backward()
        grad_err = 0.0
        for p, q in zip(model.parameters(), serial.parameters()):
            if q.grad is not None:
                grad = p.grad.clone()
                dist.all_reduce(grad)
                grad_err = max(grad_err, (grad / world_size - q.grad).abs().max().item())
        results[f"DiT-T/2/ulysses/{size}"] = ((out - ref).abs().max().item(), grad_err)
    try:  # a model without SequenceSwitch markers cannot run DSP
        apply_dsp(_build("Vchitect-tiny"), dist.group.WORLD)
        refusal = None
    except ValueError as err:
        refusal = str(err)
    return results, refusal


rank_checks("video models", world_size=2)(_compare)
rank_checks("video models", world_size=4)(_compare)


@pytest.mark.parametrize("world_size", [2, 4])
def test_video_sequence_parallel_matches_serial(world_size):
    for rank, (results, refusal) in enumerate(spawn_results("video models", world_size)):
        assert refusal is not None and "SequenceSwitch" in refusal, refusal
        for case, (out_err, grad_err) in results.items():
            assert out_err < 1e-5, f"rank {rank} {case}: output differs by {out_err}"
            assert grad_err < 1e-5, f"rank {rank} {case}: SP-mean gradient differs by {grad_err}"


def test_joint_attention_op_takes_only_a_key_mask():
    from opendit_lite.models.layers.attention import SDPAAttentionOp
    from opendit_lite.parallel.sequence import SequenceParallelState
    from opendit_lite.parallel.ulysses import UlyssesJointAttentionOp

    state = SequenceParallelState(None)
    state.seq_len = 5  # as the model's split records it
    op = UlyssesJointAttentionOp(SDPAAttentionOp(), state)
    q = torch.randn(1, 5, 2, 4)
    with pytest.raises(ValueError, match="key mask"):
        op(q, q, q, attn_mask=torch.ones(1, 1, 5, 5, dtype=torch.bool))
