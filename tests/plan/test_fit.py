"""``python -m opendit_lite.plan`` answers "what do I set to fit this card": the printed config fragment
runs as printed (a tiny Wan LoRA whose weights dominate its memory gets blocks swapped and an NF4/FP8
base, trains with them through train_video.py, and its exported LoRA loads in diffusers over the
original-precision base), the released 12-14B models plan without their weights, and a device (or a
host) too small exits with 2 naming the smallest device that fits."""

import os

import numpy as np
import pytest
import torch
import yaml

from opendit_lite.plan.__main__ import main as plan_main
from tests.video_scripts.test_family_scripts import ROOT, _final_checkpoint, main

# A Wan whose blocks are mostly weights (a wide feed-forward) on clips of 32 tokens: swapping and a
# low-precision base are what make it fit a tiny device. The speeds make compute slow next to the
# copies, so that swapping costs (nearly) nothing and is worth its saving.
TINY = ["lora.rank=2", "lora.alpha=4", "model.config.ffn_dim=8192", "model.config.num_layers=4", "data.image_size=8",
        "data.num_frames=2"]
TINY_PLAN = ["--config", "configs/wan_tiny_demo.yaml", "--gpu-memory", "0.012", "--reserve", "0", "--tflops", "1e-6",
             "--h2d-gbps", "1000", *TINY]


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def fragment_of(out: str) -> dict:
    return yaml.safe_load(out[out.index("# python -m opendit_lite.plan:"):])


def merged(tree: dict, top: dict) -> dict:
    out = dict(tree)
    for k, v in top.items():
        out[k] = merged(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


def test_printed_fragment_trains_as_printed_and_exports_a_lora_over_the_original_base(tmp_path, capsys, monkeypatch):
    import diffusers

    from opendit_lite.builders.lora_checkpoint import load_merged
    from opendit_lite.checkpoint.layout import saved_config
    from opendit_lite.checkpoint.weights import read_weights
    from opendit_lite.config import parse_overrides
    from tests.zero_cpu_shim import install as install_zero_cpu_shim

    assert plan_main(TINY_PLAN) == 0
    fragment = fragment_of(capsys.readouterr().out)
    assert fragment["memory"]["blocks_to_swap"] > 0 and fragment["lora"]["base_precision"] in ("fp8", "nf4")
    assert fragment["zero_degree"] in (0, 1, 2)
    install_zero_cpu_shim(monkeypatch)  # the planner picks ZeRO-2 for a LoRA run (bf16 working weights on a GPU)
    with open("configs/wan_tiny_demo.yaml") as f:
        config = merged(merged(yaml.safe_load(f), parse_overrides(TINY)), fragment)
    path = tmp_path / "fit.yaml"
    path.write_text(yaml.safe_dump(config))
    main("train_video", ["--config", str(path), f"results_dir={tmp_path}", "exp_name=fit", "max_steps=2", "log_every=1",
                         "ckpt_every=0", "data.num_samples=4", "export.lora=adapter", "lora.export_merged=false"])
    log = capsys.readouterr().out
    swapped = fragment["memory"]["blocks_to_swap"]
    assert f"block swapping: {swapped}/4 blocks" in log and f"stored in {fragment['lora']['base_precision']}" in log
    run = os.path.join(tmp_path, "fit")
    ckpt = _final_checkpoint(run)
    # The checkpoint holds the base as initialised (not its NF4/FP8 copy): at most 16 values per 64-block would
    # be NF4's grid; FP8's rows would have at most 256 values.
    base = read_weights(ckpt, use_ema=False)["blocks.0.ffn.net.0.proj.base_layer.weight"]
    assert base.dtype == torch.float32 and len(np.unique(base.numpy())) > 256 * base.shape[0] // 8
    # The export is the adapters alone (the pipeline's LoRA file): loaded over the base the run started
    # from, the original-precision weights its checkpoint holds.
    out = os.path.join(run, "diffusers")
    assert sorted(os.listdir(out)) == ["comfyui_lora.safetensors", "pytorch_lora_weights.safetensors"]
    model_config = yaml.safe_load(open(os.path.join(run, "config.yaml")))["model"]["config"]
    loaded = diffusers.WanTransformer3DModel(**model_config)
    loaded.load_state_dict({k.replace(".base_layer", ""): v for k, v in read_weights(ckpt, use_ema=False).items()
                            if ".lora_" not in k})
    loaded.load_lora_adapter(out, weight_name="pytorch_lora_weights.safetensors")
    reference = load_merged(diffusers.WanTransformer3DModel(**model_config), ckpt, use_ema=True,
                            lora=saved_config(ckpt)["lora"])
    inputs = dict(hidden_states=torch.randn(1, 3, 2, 8, 8), timestep=torch.tensor([500.0]),
                  encoder_hidden_states=torch.randn(1, 8, 32), return_dict=False)
    with torch.no_grad():
        assert (loaded(**inputs)[0] - reference(**inputs)[0]).abs().max().item() < 1e-5


@pytest.mark.parametrize("config,extra", [
    ("configs/wan14b_lora_24gb.yaml", []),
    ("configs/flux_dev_lora_24gb.yaml", []),
    ("configs/wan14b_lora_24gb.yaml", ["model.name=HunyuanVideoTransformer3DModel",
                                       "model.path=/path/to/HunyuanVideo/transformer"]),
])
def test_released_models_plan_to_fit_24_gib_without_their_weights(capsys, config, extra):
    assert plan_main(["--config", config, "--gpu-memory", "24", "--host-memory", "64", *extra]) == 0
    out = capsys.readouterr().out
    assert "planned with the released" in out
    fragment = fragment_of(out)
    assert fragment["memory"]["blocks_to_swap"] > 0 or fragment["lora"]["base_precision"] != "none"
    peak = float(out.split("# predicted peak ")[1].split(" GiB")[0])
    assert peak <= 24 * 0.9 - 1
    if not extra:  # the shipped config carries what the planner prints
        with open(config) as f:
            shipped = yaml.safe_load(f)
        for key, value in fragment.items():
            if isinstance(value, dict):
                assert all(shipped[key][k] == v for k, v in value.items()), (key, value)
            else:
                assert shipped[key] == value, (key, value)


@pytest.mark.parametrize("config,host,why", [
    ("configs/wan14b_full_8x80gb.yaml", "256", "no setting fits a batch of 1"),
    # 24 GiB of RAM cannot hold 26 swapped blocks and the offloaded inputs (about 30 GiB).
    ("configs/wan14b_lora_24gb.yaml", "24", "need more than the 19.6 GiB of host memory usable per node"),
])
def test_nothing_fits_exits_2_naming_the_smallest_device(capsys, config, host, why):
    with pytest.raises(SystemExit) as e:
        plan_main(["--config", config, "--gpu-memory", "24", "--host-memory", host])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and "smallest device that fits is" in err and why in err, err
