"""scripts/export_diffusers.py and opendit_lite.interop: our DiT -> a diffusers folder ->
``from_pretrained`` -> the same outputs (fp32 1e-5: plainly with model.timestep_spacing=diffusers,
after use_meta_timestep_frequencies with Meta's spacing, which the export refuses unless
--allow-inexact), and back; every bad input ends with exit 2 and one paragraph."""

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


def _dit(seed, spacing="meta"):
    torch.manual_seed(seed)
    model = build_model(MODEL["name"], input_size=(8, 8), in_channels=4, num_classes=10, class_dropout_prob=0.1,
                        timestep_spacing=spacing)
    with torch.no_grad():  # every trainable weight non-trivial; pos_embed stays the fixed table
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _inputs():
    g = torch.Generator().manual_seed(3)
    return torch.randn(3, 4, 8, 8, generator=g), torch.randint(0, 1000, (3,), generator=g), torch.tensor([0, 7, 10])


def _checkpoint(tmp_path, spacing="meta"):
    """A train.py-like checkpoint folder: model/ (trained weights), ema.safetensors, meta.json."""
    trained, ema = _dit(0, spacing), _dit(1, spacing)
    ckpt = tmp_path / f"ckpt-{spacing}"
    os.makedirs(ckpt / "model")
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(ckpt / "model" / "model.safetensors"))
    weights = {k: v.contiguous() for k, v in ema.state_dict().items() if k != "pos_embed"}
    save_file(weights, str(ckpt / "ema.safetensors"))
    model = dict(MODEL, timestep_spacing=spacing)
    (ckpt / "meta.json").write_text(json.dumps({"extra_state": {"config": {"model": model, "diffusion": {}}}}))
    return str(ckpt), trained, ema


def test_export_loads_in_diffusers_with_the_same_outputs_and_imports_back(tmp_path, capsys):
    from diffusers import DiTTransformer2DModel

    ckpt, trained, ema = _checkpoint(tmp_path)
    out = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "exported"), "--allow-inexact"])
    warning = capsys.readouterr().err
    assert "warning:" in warning and "differs from the model by up to 0.0" in warning
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
    out = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "raw"), "--no-ema", "--allow-inexact"])
    transformer = use_meta_timestep_frequencies(DiTTransformer2DModel.from_pretrained(out).eval())
    x, t, y = _inputs()
    with torch.no_grad():
        assert (transformer(x, timestep=t, class_labels=y, return_dict=False)[0] - trained(x, t, y)).abs().max() < TOL


def test_vae_gives_a_dit_pipeline_folder(tmp_path, capsys):
    from diffusers import DiTPipeline

    from tests.tiny_assets import save_tiny_vae

    ckpt, _, ema = _checkpoint(tmp_path)
    vae = save_tiny_vae(tmp_path / "vae")
    out = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "pipe"), "--vae", vae,
                          "--allow-inexact"])
    assert "null class" in capsys.readouterr().err
    pipe = DiTPipeline.from_pretrained(out)
    assert pipe.transformer.config.num_layers == 2 and pipe.scheduler.config.num_train_timesteps == 1000
    # DiTPipeline's guidance takes class 1000 as the null class: with 10 classes, no guidance.
    images = pipe(class_labels=[1], num_inference_steps=2, guidance_scale=1.0, output_type="np",
                  generator=torch.Generator().manual_seed(0)).images
    assert images.shape == (1, 16, 16, 3)


def test_the_timestep_spacing_difference_is_measured():
    assert 1e-3 < timestep_frequency_mismatch(_dit(0)) < 0.5


def test_a_model_trained_with_diffusers_spacing_loads_exactly_with_a_plain_from_pretrained(tmp_path, capsys):
    from diffusers import DiTTransformer2DModel

    ckpt, _, ema = _checkpoint(tmp_path, spacing="diffusers")
    out = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "exact")])
    assert "warning" not in capsys.readouterr().err
    transformer = DiTTransformer2DModel.from_pretrained(out).eval()
    x, t, y = _inputs()
    with torch.no_grad():
        assert (transformer(x, timestep=t, class_labels=y, return_dict=False)[0] - ema(x, t, y)).abs().max() < TOL
    # and back: the import keeps diffusers' spacing (and says how to fine-tune with it)
    back = from_diffusers_dit(transformer).eval()
    assert back.t_embedder.spacing == "diffusers"
    with torch.no_grad():
        assert (back(x, t, y) - ema(x, t, y)).abs().max().item() < TOL
    _script().main(["--from-diffusers", out, "--output", str(tmp_path / "back.safetensors")])
    assert "model.timestep_spacing=diffusers" in capsys.readouterr().err
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "exact").iterdir()}
    assert modes == {"config.json": 0o644, "diffusion_pytorch_model.safetensors": 0o644}


def test_timestep_spacing_reaches_the_model_from_the_config():
    from opendit_lite.builders.image import build_model_from_config
    from opendit_lite.config import ConfigError, load_config

    cfg = load_config(None, ["model.name=DiT-T/2", "model.timestep_spacing=diffusers", "model.input_size=[8]",
                              "model.in_channels=4", "model.num_classes=10"])
    assert build_model_from_config(cfg).t_embedder.spacing == "diffusers"
    cfg = load_config(None, ["model.name=STDiT-tiny", "model.timestep_spacing=diffusers", "model.input_size=[8]",
                              "model.in_channels=4", "model.num_classes=10"])
    with pytest.raises(ConfigError):
        build_model_from_config(cfg)


def _expect_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _script().main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_an_inexact_export_is_refused_naming_the_difference_and_the_way_out(tmp_path, capsys):
    ckpt, _, _ = _checkpoint(tmp_path)
    _expect_exit_2(["--checkpoint", ckpt, "--output", str(tmp_path / "out")], "model.timestep_spacing=diffusers",
                   capsys)
    assert not (tmp_path / "out").exists()


def _bad_inputs(tmp_path):
    """name -> (arguments, the paragraph's key words), each a mistake a user makes."""
    ckpt, _, _ = _checkpoint(tmp_path, spacing="diffusers")
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.png").write_text("x")
    no_meta = tmp_path / "no-meta"
    no_meta.mkdir()
    broken = tmp_path / "broken"
    os.makedirs(broken / "model")
    (broken / "model" / "model.safetensors").write_bytes(b"not safetensors")
    (broken / "meta.json").write_text((tmp_path / ckpt / "meta.json").read_text())
    bad_meta = tmp_path / "bad-meta"
    bad_meta.mkdir()
    (bad_meta / "meta.json").write_text("{not json")
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    save_file({"x": torch.zeros(1)}, str(no_config / "diffusion_pytorch_model.safetensors"))
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps({"_class_name": "DiTTransformer2DModel"}))
    torch.save({"x": torch.zeros(1)}, str(pickled / "diffusion_pytorch_model.bin"))
    return {
        "missing checkpoint": (["--checkpoint", "/nonexistent", "--output", "x"], "is not a folder"),
        "checkpoint without meta": (["--checkpoint", str(no_meta), "--output", "x"], "has no model config"),
        "unreadable meta.json": (["--checkpoint", str(bad_meta), "--output", "x"], "is not a readable checkpoint"),
        "corrupt weights": (["--checkpoint", str(broken), "--output", str(tmp_path / "o")], "cannot rebuild"),
        "output is a file": (["--checkpoint", ckpt, "--output", str(tmp_path / "file.txt")], "is an existing file"),
        "output holds other files": (["--checkpoint", ckpt, "--output", str(tmp_path / "photos")],
                                     "not an earlier diffusers export"),
        "import to a non-safetensors": (["--from-diffusers", "/nonexistent", "--output", "x.pt"],
                                        "must name a .safetensors file"),
        "folder without config": (["--from-diffusers", str(no_config), "--output", str(tmp_path / "a.safetensors")],
                                  "has no config.json"),
        "pickled weights": (["--from-diffusers", str(pickled), "--output", str(tmp_path / "b.safetensors")],
                            "only pickled weights (diffusion_pytorch_model.bin)"),
        "lora on a DiT": (["--checkpoint", ckpt, "--output", str(tmp_path / "l"), "--lora", "adapter"],
                          "--lora and --lora-format apply to diffusers-family runs"),
        "import options on an export": (["--from-diffusers", str(pickled), "--output", "c.safetensors", "--no-ema"],
                                        "apply to --checkpoint exports"),
    }


BAD_INPUTS = ("missing checkpoint", "checkpoint without meta", "unreadable meta.json", "corrupt weights",
              "output is a file", "output holds other files", "import to a non-safetensors", "folder without config",
              "pickled weights", "lora on a DiT", "import options on an export")


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_errors_exit_2_with_one_paragraph(case, tmp_path, capsys):
    args, message = _bad_inputs(tmp_path)[case]
    _expect_exit_2(args, message, capsys)
    assert (tmp_path / "file.txt").read_text() == "x" and os.listdir(tmp_path / "photos") == ["a.png"]
