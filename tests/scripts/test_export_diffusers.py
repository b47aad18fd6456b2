"""scripts/export_diffusers.py and opendit_lite.interop: our DiT -> a diffusers folder ->
``from_pretrained`` -> the same outputs (fp32 1e-5 with Meta's timestep spacing), and back."""

import importlib.util
import json
import os

import pytest
import torch
from safetensors.torch import save_file

from opendit_lite.interop import from_diffusers_dit, timestep_frequency_mismatch, use_meta_timestep_frequencies
from opendit_lite.models import build_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-5
MODEL = {"name": "DiT-T/2", "input_size": [8, 8], "in_channels": 4, "num_classes": 10, "learn_sigma": True,
         "class_dropout_prob": 0.1}


def _script():
    path = os.path.join(ROOT, "scripts", "export_diffusers.py")
    spec = importlib.util.spec_from_file_location("export_diffusers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dit(seed):
    torch.manual_seed(seed)
    model = build_model(MODEL["name"], input_size=(8, 8), in_channels=4, num_classes=10, class_dropout_prob=0.1)
    with torch.no_grad():  # every trainable weight non-trivial; pos_embed stays the fixed table
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _inputs():
    g = torch.Generator().manual_seed(3)
    return torch.randn(3, 4, 8, 8, generator=g), torch.randint(0, 1000, (3,), generator=g), torch.tensor([0, 7, 10])


def _checkpoint(tmp_path):
    """A train.py-like checkpoint folder: model/ (trained weights), ema.safetensors, meta.json."""
    trained, ema = _dit(0), _dit(1)
    ckpt = tmp_path / "ckpt"
    os.makedirs(ckpt / "model")
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(ckpt / "model" / "model.safetensors"))
    weights = {k: v.contiguous() for k, v in ema.state_dict().items() if k != "pos_embed"}
    save_file(weights, str(ckpt / "ema.safetensors"))
    (ckpt / "meta.json").write_text(json.dumps({"extra_state": {"config": {"model": MODEL, "diffusion": {}}}}))
    return str(ckpt), trained, ema


def test_export_loads_in_diffusers_with_the_same_outputs_and_imports_back(tmp_path):
    from diffusers import DiTTransformer2DModel

    ckpt, trained, ema = _checkpoint(tmp_path)
    out = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "exported")])
    transformer = DiTTransformer2DModel.from_pretrained(out).eval()
    x, t, y = _inputs()
    with torch.no_grad():
        expected = ema(x, t, y)  # EMA weights by default
        default = transformer(x, timestep=t, class_labels=y, return_dict=False)[0]
        use_meta_timestep_frequencies(transformer)
        exact = transformer(x, timestep=t, class_labels=y, return_dict=False)[0]
    assert (exact - expected).abs().max().item() < TOL
    assert (default - expected).abs().max().item() > 1e-3  # diffusers' own spacing: documented difference

    back = tmp_path / "back.safetensors"
    _script().main(["--from-diffusers", out, "--output", str(back)])
    model = build_model(MODEL["name"], input_size=(8, 8), in_channels=4, num_classes=10, class_dropout_prob=0.1)
    from opendit_lite.checkpoint.weights import load_weights

    load_weights(model, str(back))
    with torch.no_grad():
        assert (model.eval()(x, t, y) - expected).abs().max().item() < TOL
        assert (from_diffusers_dit(transformer).eval()(x, t, y) - expected).abs().max().item() < TOL


def test_no_ema_exports_the_trained_weights(tmp_path):
    from diffusers import DiTTransformer2DModel

    ckpt, trained, _ = _checkpoint(tmp_path)
    out = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "raw"), "--no-ema"])
    transformer = use_meta_timestep_frequencies(DiTTransformer2DModel.from_pretrained(out).eval())
    x, t, y = _inputs()
    with torch.no_grad():
        assert (transformer(x, timestep=t, class_labels=y, return_dict=False)[0] - trained(x, t, y)).abs().max() < TOL


def test_vae_gives_a_dit_pipeline_folder(tmp_path, capsys):
    from diffusers import DiTPipeline

    from tests.tiny_assets import save_tiny_vae

    ckpt, _, ema = _checkpoint(tmp_path)
    vae = save_tiny_vae(tmp_path / "vae")
    out = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "pipe"), "--vae", vae])
    assert "null class" in capsys.readouterr().err
    pipe = DiTPipeline.from_pretrained(out)
    assert pipe.transformer.config.num_layers == 2 and pipe.scheduler.config.num_train_timesteps == 1000
    # DiTPipeline's guidance takes class 1000 as the null class: with 10 classes, no guidance.
    images = pipe(class_labels=[1], num_inference_steps=2, guidance_scale=1.0, output_type="np",
                  generator=torch.Generator().manual_seed(0)).images
    assert images.shape == (1, 16, 16, 3)


def test_the_timestep_spacing_difference_is_measured():
    assert 1e-3 < timestep_frequency_mismatch(_dit(0)) < 0.5


@pytest.mark.parametrize("args, message", [
    (["--checkpoint", "/nonexistent", "--output", "x"], "is not a folder"),
    (["--from-diffusers", "/nonexistent", "--output", "x.pt"], "must name a .safetensors file"),
])
def test_errors_exit_2_with_one_paragraph(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _script().main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
