"""scripts/export_diffusers.py --checkpoint on a diffusers-family run (a checkpoint folder as the
trainer writes it: model/, ema.safetensors with the trainable weights' EMA, meta.json with the
run's model and lora sections): the folder loads with the plain diffusers class and gives the
EMA model's outputs (or the trained one's with --no-ema); a LoRA run's adapters alone (the default,
no copy of the base) or merged; the
family's bad inputs end with exit 2 and one paragraph."""

import importlib.util
import json
import os

import diffusers
import pytest
import torch
from safetensors.torch import save_file

from opendit_lite.interop import LORA_WEIGHT_NAME
from opendit_lite.interop.comfyui_lora import COMFYUI_WEIGHT_NAME
from opendit_lite.models.lora import apply_lora
from tests.diffusers_families import CONFIGS, build, forward_inputs, output, randomize_adapters

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-5
LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "targets": None}


def _script():
    spec = importlib.util.spec_from_file_location("export_diffusers", os.path.join(ROOT, "scripts",
                                                                                    "export_diffusers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(family: str, seed: int, lora: bool) -> torch.nn.Module:
    model = build(family, seed=0)
    if lora:
        apply_lora(model, rank=LORA["rank"], alpha=LORA["alpha"], dropout=0.0)
        randomize_adapters(model, seed=seed)
    elif seed:
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.01)
    return model.eval()


def _checkpoint(tmp_path, family: str, lora: bool, section=None):
    """(checkpoint folder, trained model, EMA model): EMA differs in the trainable weights only."""
    trained, ema = _model(family, 1, lora), _model(family, 2, lora)
    ckpt = tmp_path / f"ckpt-{family}-{lora}"
    os.makedirs(ckpt / "model")
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(ckpt / "model" / "model.safetensors"))
    trainable = {n for n, p in ema.named_parameters() if p.requires_grad}
    save_file({k: v.contiguous() for k, v in ema.state_dict().items() if k in trainable}, str(ckpt / "ema.safetensors"))
    model = section or {"name": family, "config": CONFIGS[family], "path": None}
    config = {"model": model, "lora": LORA if lora else dict(LORA, rank=0)}
    (ckpt / "meta.json").write_text(json.dumps({"extra_state": {"config": config}}))
    return str(ckpt), trained, ema


@torch.no_grad()
def _diff(a, b, family):
    inputs = forward_inputs(family)
    return (output(a.eval(), inputs) - output(b.eval(), inputs)).abs().max().item()


def test_a_family_run_exports_its_ema_or_trained_weights(tmp_path, capsys):
    family = "WanTransformer3DModel"
    ckpt, trained, ema = _checkpoint(tmp_path, family, lora=False)
    out = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "ema")])
    assert "wrote a diffusers WanTransformer3DModel (EMA weights)" in capsys.readouterr().out
    assert _diff(diffusers.WanTransformer3DModel.from_pretrained(out), ema, family) < TOL
    raw = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "raw"), "--no-ema"])
    assert _diff(diffusers.WanTransformer3DModel.from_pretrained(raw), trained, family) < TOL
    assert _diff(trained, ema, family) > 1e-4
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "ema").iterdir()}
    assert set(modes.values()) == {0o644} and len(modes) == 2


def test_a_lora_run_exports_merged_or_as_an_adapter(tmp_path):
    family = "FluxTransformer2DModel"
    ckpt, _, ema = _checkpoint(tmp_path, family, lora=True)
    merged = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "merged"), "--lora", "merged"])
    assert _diff(diffusers.FluxTransformer2DModel.from_pretrained(merged), ema, family) < TOL
    adapter = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "adapter")])  # a LoRA run's default
    # no copy of the base beside the adapters, in both formats (Flux has an original layout)
    assert sorted(os.listdir(adapter)) == [COMFYUI_WEIGHT_NAME, LORA_WEIGHT_NAME]
    loaded = build(family, seed=0)                     # the base the run trained on
    loaded.load_lora_adapter(adapter, weight_name=LORA_WEIGHT_NAME)
    assert _diff(loaded, ema, family) < TOL
    comfy = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "comfy"), "--lora-format", "comfyui"])
    assert os.listdir(comfy) == [COMFYUI_WEIGHT_NAME]
    with pytest.raises(SystemExit) as exit_info:  # the ComfyUI file is of adapters: refused with --lora merged
        _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "x"), "--lora", "merged",
                        "--lora-format", "comfyui"])
    assert exit_info.value.code == 2
    # an export replaces an earlier one in place, leaving no file of it behind
    again = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "adapter"), "--lora", "merged"])
    assert sorted(os.listdir(again)) == ["config.json", "diffusion_pytorch_model.safetensors"]


def test_a_model_loaded_from_a_folder_is_rebuilt_from_its_config(tmp_path):
    family = "LTXVideoTransformer3DModel"
    folder = tmp_path / "pretrained"
    build(family).save_pretrained(folder)
    section = {"name": family, "config": None, "path": str(folder)}
    ckpt, _, ema = _checkpoint(tmp_path, family, lora=False, section=section)
    out = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / "ltx")])
    assert _diff(diffusers.LTXVideoTransformer3DModel.from_pretrained(out), ema, family) < TOL


def _expect_exit_2(argv, message, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        _script().main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_family_bad_inputs_exit_2_with_one_paragraph(tmp_path, capsys):
    family = "WanTransformer3DModel"
    ckpt, _, _ = _checkpoint(tmp_path, family, lora=False)
    out = ["--output", str(tmp_path / "out")]
    _expect_exit_2(["--checkpoint", ckpt, "--lora", "adapter"] + out, "needs a LoRA run", capsys)
    _expect_exit_2(["--checkpoint", ckpt, "--vae", "x"] + out, "apply to DiT exports", capsys)
    gone = {"name": family, "config": None, "path": str(tmp_path / "gone")}
    ckpt_gone, _, _ = _checkpoint(tmp_path / "g", family, lora=False, section=gone)
    _expect_exit_2(["--checkpoint", ckpt_gone] + out, "is no longer there", capsys)
    os.remove(os.path.join(ckpt, "model", "model.safetensors"))
    _expect_exit_2(["--checkpoint", ckpt] + out, "cannot read the weights", capsys)
    assert not (tmp_path / "out").exists()


def _pipeline_checkpoint(tmp_path, pipeline: str, lora: bool):
    """(checkpoint folder, EMA model) of a run on ``pipeline``'s Flux transformer (model.pipeline, no model.path)."""
    import diffusers

    models = []
    for seed in (1, 2):  # trained, EMA
        model = diffusers.FluxTransformer2DModel.from_pretrained(os.path.join(pipeline, "transformer"))
        if lora:
            apply_lora(model, rank=LORA["rank"], alpha=LORA["alpha"], dropout=0.0)
            randomize_adapters(model, seed=seed)
        else:
            with torch.no_grad():
                g = torch.Generator().manual_seed(seed)
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * 0.01)
        models.append(model.eval())
    trained, ema = models
    ckpt = tmp_path / f"ckpt-pipeline-{lora}"
    os.makedirs(ckpt / "model")
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(ckpt / "model" / "model.safetensors"))
    trainable = {n for n, p in ema.named_parameters() if p.requires_grad}
    save_file({k: v.contiguous() for k, v in ema.state_dict().items() if k in trainable}, str(ckpt / "ema.safetensors"))
    section = {"name": "FluxTransformer2DModel", "config": None, "path": None, "pipeline": pipeline, "expert": None}
    config = {"model": section, "lora": LORA if lora else dict(LORA, rank=0)}
    (ckpt / "meta.json").write_text(json.dumps({"extra_state": {"config": config}}))
    return str(ckpt), ema


def test_a_run_from_a_pipeline_exports_what_that_pipeline_loads(tiny_pipeline, tmp_path):
    """A LoRA run: FluxPipeline.load_lora_weights reads the adapters (no warning) onto the pipeline's
    transformer, which then computes the EMA model; a full run: a pipeline folder (transformer fresh,
    the rest linked) that DiffusionPipeline.from_pretrained loads with the EMA transformer."""
    from tests.video_scripts.test_lora_export import LoadLog

    pipeline = tiny_pipeline("flux")
    inputs = dict(hidden_states=torch.randn(1, 16, 64), timestep=torch.tensor([0.5]), guidance=torch.tensor([3.5]),
                  pooled_projections=torch.randn(1, 16), encoder_hidden_states=torch.randn(1, 8, 32),
                  txt_ids=torch.zeros(8, 3), img_ids=torch.zeros(16, 3), return_dict=False)
    for lora in (True, False):
        ckpt, ema = _pipeline_checkpoint(tmp_path, pipeline, lora)
        out = _script().main(["--checkpoint", ckpt, "--output", str(tmp_path / f"out-{lora}")]
                             + (["--lora-format", "diffusers"] if lora else []))
        if lora:
            assert os.listdir(out) == [LORA_WEIGHT_NAME]
            pipe = diffusers.FluxPipeline.from_pretrained(pipeline)
            with LoadLog() as log:
                pipe.load_lora_weights(out)
            assert not log.key_warnings(), log.text()  # (its text encoder's "no LoRA keys, safe to ignore")
        else:
            assert os.path.islink(os.path.join(out, "vae")) and not os.path.islink(os.path.join(out, "transformer"))
            pipe = diffusers.DiffusionPipeline.from_pretrained(out)
        with torch.no_grad():
            assert (pipe.transformer(**inputs)[0] - ema(**inputs)[0]).abs().max() < TOL, lora
