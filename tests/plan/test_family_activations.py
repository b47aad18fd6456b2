"""The planner on the six diffusers families: saved activations counted from each model's forward on
the meta device (``plan/activation_count.py``), then predicted for another clip shape and batch, within
15% of the bytes autograd really saves on CPU (every saved tensor's storage, counted once)."""

import os

import pytest
import torch

from opendit_lite.families import FamilyDenoiser, family_adapter
from opendit_lite.plan import family_shape
from opendit_lite.plan.memory_model import activation_bytes
from tests import diffusers_families as fam

TEXT = 6
WAN_DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "wan_tiny_demo.yaml")


def saved_bytes(model, run) -> int:
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage._cdata not in params:
            seen[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


@pytest.fixture(scope="module")
def diffusers():
    return pytest.importorskip("diffusers")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", fam.FAMILIES)
def test_counted_prediction_within_15_percent_on_cpu(diffusers, name, dtype):
    """In fp32, and in bf16, where the layers that keep fp32 copies (FP32LayerNorm, rotary embeddings)
    make the saved bytes more than half of fp32's: the count runs in the training dtype."""
    cls = getattr(diffusers, name)
    with torch.device("meta"):
        meta = cls(**fam.CONFIGS[name])
    shape = family_shape(meta, TEXT, dtype=dtype)
    model = torch.nn.Module.to(fam.build(name), dtype)  # the whole model cast, as ZeRO casts it
    adapter = family_adapter(model)
    pt, ph, pw = adapter.patch_size(model.config)
    B, T, H, W = 2, (1 if adapter.image_only else 3 * pt), 6 * ph, 5 * pw        # not the shapes it counted at
    width = adapter.text_width(model.config)
    denoiser = FamilyDenoiser(adapter, model, model.config, TEXT, width)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, adapter.latent_channels(model.config), T, H, W, generator=gen).to(dtype)
    y = torch.randn(B, TEXT, width, generator=gen).to(dtype)
    mask = torch.ones(B, TEXT, dtype=torch.bool)
    measured = saved_bytes(model, lambda: denoiser(x, torch.rand(B, generator=gen) * 999, y, mask))
    predicted = activation_bytes(shape, T, H, W, B, element_bytes=dtype.itemsize, caption_tokens=TEXT)
    print(f"{name} {dtype}: predicted/counted {predicted / measured:.3f}")
    assert abs(predicted / measured - 1) < 0.15, f"{name}: predicted {predicted:.0f} B, counted {measured} B"


def test_wan_demo_config_plans(capsys):
    from opendit_lite.plan.__main__ import main as plan_main

    assert plan_main(["--config", WAN_DEMO, "--gpu-memory", "80", "--world-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "model WanTransformer3DModel" in out and "counted from the model's forward" in out


@pytest.mark.parametrize("name", fam.FAMILIES)
def test_every_family_plans_from_a_config(diffusers, capsys, tmp_path, name):
    """The Wan demo config with model.name/model.config of each family (images: 1-frame clips), at sp 2."""
    import yaml

    from opendit_lite.plan.__main__ import main as plan_main

    with open(WAN_DEMO) as f:
        cfg = yaml.safe_load(f)
    cfg["model"] = {"name": name, "config": fam.CONFIGS[name]}
    if family_adapter(name).image_only:
        cfg["data"]["num_frames"] = 1
    path = tmp_path / "family.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert plan_main(["--config", str(path), "--gpu-memory", "80", "--world-size", "8", "sp_size=2",
                      "--keep-settings"]) == 0
    out = capsys.readouterr().out
    assert f"model {name}" in out and "sp_mode=ulysses" in out and "counted from the model's forward" in out
    assert "x 1 sequence(s)" in out            # a family's SP attention sees every token of the clip


def test_plan_accuracy_benchmark_measures_a_family_on_cpu(diffusers):
    """benchmarks/plan_accuracy.py --families on CPU with the tiny Wan: the same count as the test above."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "plan_accuracy.py")
    spec = importlib.util.spec_from_file_location("plan_accuracy", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    row = bench.measure_family("Wan-tiny", "WanTransformer3DModel", fam.CONFIGS["WanTransformer3DModel"], 3, 6, 10,
                               2, TEXT, device="cpu")
    assert row["device"] == "cpu" and abs(row["act_ratio"] - 1) < 0.15, row
