"""LoRA: only the adapters train (the frozen base is unchanged after steps), under DDP and ZeRO-1/2
the sharded EMA averages only the adapters and training equals one process, and the merged export
equals the adapted model (in-process and through train.py's end step)."""

import os

import torch
import torch.nn as nn
from peft import LoraConfig
from safetensors.torch import save_file

from opendit_lite.models import DiT
from opendit_lite.models.lora import apply_lora, lora_target_names, merge_lora
from tests.distributed import run_distributed
from tests.plugins.common import LR, local_slice, loss_fn, make_batches, max_diff
from tests.script_server import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGETS = ["qkv", "proj", "fc1", "fc2"]
STEPS = 3


def pretrained_tiny_dit() -> DiT:
    """A tiny DiT with every weight random: a freshly initialised DiT's zero output layer would pass
    no gradient to the adapters, a pretrained model's does."""
    torch.manual_seed(0)
    model = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=2, num_heads=2, num_classes=10,
                class_dropout_prob=0.0, learn_sigma=False)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    return model


def reference_lora_run(steps: int):
    """One process, plain AdamW on the adapters over the whole global batch."""
    model = pretrained_tiny_dit()
    apply_lora(model, rank=4, alpha=8.0, dropout=0.0, targets=TARGETS)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    for batch in make_batches(steps):
        loss_fn(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_targets_are_linear_layers_only():
    names = lora_target_names(pretrained_tiny_dit(), TARGETS)
    assert "x_embedder.proj" not in names  # a Conv2d named proj
    assert sorted(names) == sorted(f"blocks.{b}.{m}" for b in range(2)
                                   for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"))
    assert lora_target_names(pretrained_tiny_dit(), [r"blocks\.1\.attn\..*"]) == ["blocks.1.attn.qkv",
                                                                                 "blocks.1.attn.proj"]


def test_only_adapters_train_and_merge_equals_adapted():
    model = pretrained_tiny_dit()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    x, t, y, _ = make_batches(1)[0]
    before = model(x, t, y)
    report = apply_lora(model, rank=4, alpha=8.0, dropout=0.0, targets=TARGETS)
    assert report.layers == 8 and 0 < report.trainable < report.total / 5
    torch.testing.assert_close(model(x, t, y), before, rtol=0, atol=0)  # adapters start as a no-op
    trained = reference_lora_run(STEPS)
    model.load_state_dict(trained)
    for name, value in trained.items():
        if ".lora_" in name:
            continue
        key = name.replace(".base_layer", "")
        torch.testing.assert_close(value, base[key], rtol=0, atol=0, msg=f"frozen {key} changed")
    assert any(v.abs().max() > 0 for n, v in trained.items() if ".lora_B" in n), "the adapters did not train"
    adapted = model(x, t, y)
    assert (adapted - before).abs().max() > 1e-4
    merged = merge_lora(model)
    assert set(merged.state_dict()) == set(base)
    assert all(isinstance(merged.get_submodule(n), nn.Linear) for n in lora_target_names(merged, TARGETS))
    torch.testing.assert_close(merged(x, t, y), adapted, rtol=1e-5, atol=1e-5)


def _train_boosted(rank, world_size):
    from colossalai.booster import Booster

    from opendit_lite.plugins import OpenDiTPlugin
    from tests.zero_cpu_shim import install as install_zero_cpu_shim

    install_zero_cpu_shim()
    out = {}
    for zero_degree in (0, 1, 2):
        plugin = OpenDiTPlugin(zero_degree=zero_degree, precision="fp32")
        assert plugin.support_lora()
        booster = Booster(plugin=plugin)
        model = booster.enable_lora(pretrained_tiny_dit(), lora_config=LoraConfig(
            r=4, lora_alpha=8.0, lora_dropout=0.0, target_modules=TARGETS))
        optimizer = plugin.build_optimizer([p for p in model.parameters() if p.requires_grad], lr=LR)
        model, optimizer, *_ = booster.boost(model, optimizer)
        plugin.create_ema(model)
        for batch in make_batches(STEPS):
            booster.backward(loss_fn(model, local_slice(batch, plugin.dp_rank, plugin.dp_size)), optimizer)
            optimizer.step()
            optimizer.zero_grad()
            plugin.update_ema(model, decay=0.0)  # decay 0: the EMA is the current weights
        adapters = sum(p.numel() for p in model.unwrap().parameters() if p.requires_grad)
        out[zero_degree] = dict(params={n: p.detach().clone() for n, p in model.unwrap().named_parameters()},
                                ema=plugin.ema.state_dict(), ema_numel=plugin.ema.numel_local(), adapters=adapters)
    return out


def test_lora_with_ddp_and_zero_equals_one_process():
    results = run_distributed(_train_boosted, world_size=2)
    reference = reference_lora_run(STEPS)
    for zero_degree, got in results[0].items():
        assert max_diff(got["params"], reference) < 2e-5, zero_degree  # summation order, through Adam
        assert max_diff({k: got["ema"][k] for k in reference}, reference) < 2e-5, zero_degree
        # The EMA shards only the adapters: about half of them per rank (plus padding).
        assert got["ema_numel"] <= got["adapters"] // 2 + 64, (zero_degree, got["ema_numel"], got["adapters"])


def test_train_py_merged_export_equals_adapted_model(tmp_path):
    """train.py with lora.rank from a pretrained init: base unchanged in the checkpoint, merged.safetensors
    equals the adapted model, and sample.py samples the LoRA checkpoint."""
    from opendit_lite.checkpoint.weights import load_weights, read_weights

    base = DiT(input_size=16, patch_size=2, in_channels=3, hidden_size=64, depth=2, num_heads=4, num_classes=8,
               class_dropout_prob=0.1, learn_sigma=False)  # DiT-T/2 as the demo config builds it at 16 px
    with torch.no_grad():
        for p in base.parameters():
            p.normal_(0.0, 0.05)
    init = str(tmp_path / "pretrained.safetensors")
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, init)
    args = ["--config", "configs/demo.yaml", f"results_dir={tmp_path}", "exp_name=lora", "model.name=DiT-T/2",
            "data.image_size=16", "data.num_samples=64", "global_batch_size=8", "max_steps=3", "log_every=3",
            "logger=[]", f"init_from={init}", "lora.rank=2", "lr=1e-2", "sample.num_sampling_steps=2",
            "sample.samples_per_class=1", "sample.class_labels=[0,1]"]
    for script in ("train.py", "sample.py"):
        proc = run_script([script, *args], cwd=ROOT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    ckpt = str(tmp_path / "lora" / "checkpoints" / "lora_step3")
    saved = read_weights(ckpt, use_ema=False)
    for key, value in base.state_dict().items():
        stored = saved.get(key, saved.get(key.replace(".weight", ".base_layer.weight").replace(
            ".bias", ".base_layer.bias")))
        torch.testing.assert_close(stored, value, rtol=0, atol=0, msg=f"frozen {key} changed")

    x, t, y = torch.randn(2, 3, 16, 16), torch.tensor([10, 700]), torch.tensor([0, 5])
    adapted = DiT(input_size=16, patch_size=2, in_channels=3, hidden_size=64, depth=2, num_heads=4, num_classes=8,
                  learn_sigma=False).eval()
    apply_lora(adapted, rank=2, alpha=16.0, dropout=0.0, targets=TARGETS)
    load_weights(adapted, ckpt, use_ema=True)
    merged = DiT(input_size=16, patch_size=2, in_channels=3, hidden_size=64, depth=2, num_heads=4, num_classes=8,
                 learn_sigma=False).eval()
    load_weights(merged, str(tmp_path / "lora" / "merged.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(merged(x, t, y), adapted(x, t, y), rtol=1e-5, atol=1e-5)
        assert (adapted(x, t, y) - base.eval()(x, t, y)).abs().max() > 1e-4, "the adapters did not train"
