"""benchmarks/flops.py's Wan count (the MFU of the GPU report's wan_train rows) against torch's own
FLOP counter on a toy WanTransformer3DModel: the forward exactly (every linear layer, the patch
embedding and both attention products); a training step's model FLOPs up to what the counter adds
and model FLOPs leave out (flash attention's backward recomputes the scores: +0.5 x attention's
forward) or the counter leaves out (products whose inputs need no gradient)."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.benchmarks.scripts import import_benchmark


def counted(model, x, text, backward: bool) -> int:
    with FlopCounterMode(display=False) as counter:
        out = model(hidden_states=x, timestep=torch.tensor([500.0]), encoder_hidden_states=text, return_dict=False)[0]
        if backward:
            out.sum().backward()
    return counter.get_total_flops()


def test_wan_flops_match_torchs_counter():
    import diffusers

    flops, wan_report = import_benchmark("flops"), import_benchmark("wan_report")
    config = dict(wan_report.TOY_WAN, ffn_dim=48, text_dim=24)
    torch.manual_seed(0)
    model = diffusers.WanTransformer3DModel(**config)
    frames, height, width, caption = 3, 8, 12, 7
    x = torch.randn(1, config["in_channels"], frames, height, width)
    text = torch.randn(1, caption, config["text_dim"])
    linear, attention = flops.wan_forward_macs(config, frames, height, width, caption)
    with torch.no_grad():
        assert counted(model, x, text, backward=False) == 2 * (linear + attention)
    for lora in (False, True):
        model.requires_grad_(not lora)  # LoRA: frozen weights, gradients flow to the inputs (the adapters')
        step = counted(model, x.clone().requires_grad_(lora), text, backward=True)
        expected = flops.wan_train_flops(config, frames, height, width, caption, lora)
        assert 0 <= step - expected <= 0.5 * 2 * attention, (lora, step, expected)
