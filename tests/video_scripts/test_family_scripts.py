"""train_video.py and sample_video.py with the diffusers families, in this process (no start-up
cost): a tiny Wan with buckets (images as 1-frame clips among clips of two shapes) trained and
sampled to a contact sheet; every other family a few steps from a ``model.config`` with its
recipe's objective; a model from a local diffusers folder; the bad inputs that end with exit 2
and one paragraph; and the demo config at sp_size=2 under torchrun."""

import os
import sys
from unittest import mock

import numpy as np
import pytest
import torch
import yaml

from tests import diffusers_families as families
from tests.distributed import run_script_on_ranks
from tests.video_scripts.test_video_scripts import ROOT, losses, run

WAN = ["--config", "configs/wan_tiny_demo.yaml", "exp_name=w", "log_every=1", "ckpt_every=0",
       "sample.num_sampling_steps=2", 'sample.prompts=["a red square moving right","a blue disc moving up"]']
BUCKETS = ("data.buckets=[{frames: 2, height: 8, width: 8, batch_size: 2}, "
           "{name: wide, frames: 2, height: 8, width: 12, batch_size: 2}, "
           "{name: image, frames: 1, height: 8, width: 8, batch_size: 2}]")


def script(name: str):
    sys.path.insert(0, ROOT)
    try:
        return __import__(name)
    finally:
        sys.path.remove(ROOT)


def main(name: str, args):
    """``<name>.main(args)`` in this process, from the repository root, with the environment restored
    afterwards (a one-process run sets RANK/WORLD_SIZE)."""
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with mock.patch.dict(os.environ):
            return script(name).main(list(args))
    finally:
        os.chdir(cwd)


def exits_2(capsys, name: str, args) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(name, args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err and err.strip().startswith("error:"), err
    return err


@pytest.fixture(scope="module")
def wan_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("wan"))
    main("train_video", [*WAN, f"results_dir={out}", "max_steps=3", "data.num_samples=12", BUCKETS])
    return out


def test_wan_trains_on_buckets_and_samples_a_contact_sheet(wan_run):
    assert len(losses(os.path.join(wan_run, "w"))) == 3
    assert all(np.isfinite(losses(os.path.join(wan_run, "w"))))
    saved = yaml.safe_load(open(os.path.join(wan_run, "w", "config.yaml")))
    assert saved["diffusion"] == {**saved["diffusion"], "objective": "rflow", "timestep_sampling": "uniform",
                                  "shift": 5.0}
    assert saved["model"]["caption_channels"] == 32  # the model's text_dim, where the shapes captions are drawn
    paths = main("sample_video", [*WAN, f"results_dir={wan_run}"])
    from PIL import Image

    sheet = np.asarray(Image.open(paths[-1]).convert("RGB"), dtype=np.float32)
    assert paths[-1].endswith("contact_sheet.png") and sheet.std() > 1.0


# family -> (model.config for 3-channel pixel clips, frames, overrides)
FAMILY_RUNS = {
    "FluxTransformer2DModel": (dict(in_channels=12), 1, []),
    "SD3Transformer2DModel": (dict(in_channels=3, out_channels=3), 1, []),
    "CogVideoXTransformer3DModel": (dict(in_channels=3, out_channels=3), 2, []),  # sample.sampler: ddim, as fits
    "HunyuanVideoTransformer3DModel": (dict(in_channels=3, out_channels=3), 2, []),
    "LTXVideoTransformer3DModel": (dict(in_channels=3, out_channels=3), 2, []),
}
RECIPES = {"FluxTransformer2DModel": "rflow", "SD3Transformer2DModel": "rflow", "CogVideoXTransformer3DModel": "vpred",
           "HunyuanVideoTransformer3DModel": "rflow", "LTXVideoTransformer3DModel": "rflow"}


def family_config(tmp_path, name: str) -> str:
    channels, frames, _ = FAMILY_RUNS[name]
    config = dict(families.CONFIGS[name], **channels)
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}
    tree = {"exp_name": "f", "precision": "fp32", "max_steps": 2, "global_batch_size": 2, "log_every": 1,
            "ckpt_every": 0, "model": {"name": name, "config": config},
            "data": {"type": "shapes", "num_frames": frames, "image_size": 8, "num_samples": 4},
            "text_encoder": {"kind": "shapes", "max_length": 8},
            "sample": {"num_sampling_steps": 2, "prompts": ["a red square moving right"]}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return str(path)


@pytest.mark.parametrize("name", list(FAMILY_RUNS))
def test_family_trains_with_its_recipe_and_samples(tmp_path, name):
    args = ["--config", family_config(tmp_path, name), f"results_dir={tmp_path}", *FAMILY_RUNS[name][2]]
    main("train_video", args)
    assert all(np.isfinite(losses(os.path.join(tmp_path, "f"))))
    saved = yaml.safe_load(open(os.path.join(tmp_path, "f", "config.yaml")))
    assert saved["diffusion"]["objective"] == RECIPES[name]
    paths = main("sample_video", args)
    assert paths[-1].endswith("contact_sheet.png")


def test_model_path_loads_a_local_diffusers_folder(tmp_path):
    from opendit_lite.builders.video import build_video_model
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig

    saved = families.build("WanTransformer3DModel")
    saved.save_pretrained(str(tmp_path / "wan"))
    cfg = load_config(None, ["model.name=WanTransformer3DModel", f"model.path={tmp_path / 'wan'}"],
                      schema=VideoTrainConfig)
    loaded = build_video_model(cfg)
    for (k, a), (_, b) in zip(saved.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=k)


def test_unknown_diffusers_class_lists_the_supported_ones(capsys, tmp_path):
    err = exits_2(capsys, "train_video", [*WAN, "model.name=WanTransformer9DModel", f"results_dir={tmp_path}"])
    assert "WanTransformer9DModel' is not a registered model" in err
    assert all(f in err for f in families.FAMILIES), err


def test_model_folder_without_config_json(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    err = exits_2(capsys, "train_video", [*WAN, "model.config=null", f"model.path={tmp_path / 'empty'}",
                                          f"results_dir={tmp_path}"])
    assert "holds no config.json" in err


def test_latent_channels_the_data_cannot_provide(capsys, tmp_path):
    err = exits_2(capsys, "train_video", [*WAN, "model.config.in_channels=16", "model.config.out_channels=16",
                                          f"results_dir={tmp_path}"])
    assert "takes 16-channel latent clips" in err and "pixel clips (no VAE) have 3 channels" in err


def test_image_family_refuses_multi_frame_clips(capsys, tmp_path):
    err = exits_2(capsys, "train_video", ["--config", family_config(tmp_path, "FluxTransformer2DModel"),
                                          "data.num_frames=4", f"results_dir={tmp_path}"])
    assert "is an image model" in err and "data.num_frames=1" in err


def test_caption_width_the_text_encoder_cannot_provide(capsys, tmp_path):
    err = exits_2(capsys, "train_video", [*WAN, "model.caption_channels=64", f"results_dir={tmp_path}"])
    assert "takes 32-wide caption states" in err


def test_ulysses_sp_size_not_dividing_the_heads_suggests_ring(capsys, tmp_path):
    err = exits_2(capsys, "train_video", [*WAN, "model.config.num_attention_heads=3", "sp_size=2",
                                          "sp_mode=ulysses", f"results_dir={tmp_path}"])
    assert "num_heads=3, not divisible by sp_size=2" in err and "sp_mode=ring" in err


@pytest.mark.slow
def test_wan_demo_config_trains_sequence_parallel_under_torchrun(tmp_path):
    """sp_size=2 on 2 ranks (one data-parallel rank: both hold the same clips) gives the serial losses,
    and sampling at sp_size=2 the serial contact sheet."""
    args = [*WAN, "max_steps=2", "data.num_samples=8", "global_batch_size=2"]
    proc = run(["train_video.py", *args, "sp_size=2", f"results_dir={tmp_path / 'sp'}"], torchrun=True)
    assert "ulysses over 2 ranks" in proc.stdout + proc.stderr
    main("train_video", [*args, f"results_dir={tmp_path / 'serial'}"])
    sp, serial = losses(os.path.join(tmp_path, "sp", "w")), losses(os.path.join(tmp_path, "serial", "w"))
    assert len(sp) == 2 and np.allclose(sp, serial, rtol=1e-4, atol=0), (sp, serial)
    # sample_video.py at sp_size=2 writes the one-process contact sheet
    from PIL import Image

    sheets = []
    for name, extra, torchrun in (("one", [], False), ("two", ["sp_size=2"], True)):
        out = tmp_path / f"samples_{name}"
        sample = [*args, *extra, f"results_dir={tmp_path / 'serial'}", f"sample.output_dir={out}"]
        if torchrun:  # the ranks started as torchrun starts them (train_video.py above is the torchrun smoke test)
            assert [code for code, _ in run_script_on_ranks("sample_video.py", sample)] == [0, 0]
        else:
            main("sample_video", sample)
        sheets.append(np.asarray(Image.open(out / "contact_sheet.png")))
    assert np.array_equal(*sheets)


def latents_folder(tmp_path, width: int) -> str:
    from opendit_lite.data.video_latents import save_video_latents

    g = torch.Generator().manual_seed(0)
    folder = str(tmp_path / f"latents{width}")
    for i in range(4):  # latents [C, T, h, w], caption states [M, width] with their mask, as extract_latents.py writes
        save_video_latents(folder, i, torch.randn(4, 2, 8, 8, generator=g), torch.randn(8, width, generator=g),
                           torch.arange(8) < 5, "a red square moving right")
    return folder


LATENT_WAN = ["model.config.in_channels=4", "model.config.out_channels=4", "data.type=latents", "max_steps=2",
              "global_batch_size=2"]


def test_wan_trains_from_precomputed_latents(tmp_path):
    main("train_video", [*WAN, *LATENT_WAN, f"data.path={latents_folder(tmp_path, 32)}", f"results_dir={tmp_path}"])
    saved = yaml.safe_load(open(os.path.join(tmp_path, "w", "config.yaml")))
    assert saved["model"]["in_channels"] == 4 and saved["model"]["num_frames"] == 2
    assert all(np.isfinite(losses(os.path.join(tmp_path, "w"))))


def test_caption_states_of_another_width_than_the_model_takes(capsys, tmp_path):
    err = exits_2(capsys, "train_video", [*WAN, *LATENT_WAN, f"data.path={latents_folder(tmp_path, 16)}",
                                          f"results_dir={tmp_path}"])
    assert "takes 32-wide caption states, but the precomputed caption states give 16" in err


def _final_checkpoint(run: str) -> str:
    from opendit_lite.checkpoint.layout import find_resume_checkpoint

    return find_resume_checkpoint(os.path.join(run, "checkpoints"), os.path.basename(run))


def test_the_run_ends_with_a_diffusers_folder_holding_its_ema(wan_run):
    import diffusers

    from opendit_lite.checkpoint.weights import read_weights

    run = os.path.join(wan_run, "w")
    loaded = diffusers.WanTransformer3DModel.from_pretrained(os.path.join(run, "diffusers"))
    ema = read_weights(_final_checkpoint(run), use_ema=True)
    exported = loaded.state_dict()
    assert exported.keys() == ema.keys()
    assert all(torch.equal(exported[k], ema[k].float()) for k in exported)


def test_a_lora_run_exports_its_adapters_and_bad_export_settings_exit_2(tmp_path, capsys):
    import diffusers

    from opendit_lite.builders.lora_checkpoint import load_merged
    from opendit_lite.checkpoint.layout import saved_config
    from opendit_lite.checkpoint.weights import read_weights
    from opendit_lite.interop.diffusers_export import split_lora_state

    args = [*WAN, f"results_dir={tmp_path}", "max_steps=2", "data.num_samples=4", "global_batch_size=2",
            "lora.rank=2", "lora.alpha=4"]
    main("train_video", args)  # a LoRA run exports its adapters alone by default, and no merged.safetensors
    out = os.path.join(tmp_path, "w", "diffusers")
    assert sorted(os.listdir(out)) == ["comfyui_lora.safetensors", "pytorch_lora_weights.safetensors"]  # Wan: both
    assert not os.path.exists(os.path.join(tmp_path, "w", "merged.safetensors"))
    ckpt = _final_checkpoint(os.path.join(tmp_path, "w"))
    config = yaml.safe_load(open(os.path.join(tmp_path, "w", "config.yaml")))["model"]["config"]
    loaded = diffusers.WanTransformer3DModel(**config)  # the run's base (a random init: kept in its checkpoint)
    loaded.load_state_dict(split_lora_state(read_weights(ckpt, use_ema=False))[0])
    loaded.load_lora_adapter(out, weight_name="pytorch_lora_weights.safetensors")
    merged = load_merged(diffusers.WanTransformer3DModel(**config), ckpt, use_ema=True, lora=saved_config(ckpt)["lora"])
    inputs = dict(hidden_states=torch.randn(1, 3, 2, 8, 8), timestep=torch.tensor([500.0]),
                  encoder_hidden_states=torch.randn(1, 8, 32), return_dict=False)
    with torch.no_grad():
        assert (loaded(**inputs)[0] - merged(**inputs)[0]).abs().max().item() < 1e-5
    capsys.readouterr()  # the run's progress
    assert "export.lora=adapter" in exits_2(capsys, "train_video", [*WAN, f"results_dir={tmp_path}", "max_steps=1",
                                                                     "export.lora=adapter"])
    assert "remove export.lora" in exits_2(capsys, "train_video", [*WAN, f"results_dir={tmp_path}", "max_steps=1",
                                                                    "export.lora=merged"])
    assert "remove export.lora_format" in exits_2(capsys, "train_video", [*WAN, f"results_dir={tmp_path}",
                                                                           "export.lora_format=comfyui"])
    assert "lora.rank=0" in exits_2(capsys, "train_video", [*WAN, f"results_dir={tmp_path}", f"lora.init_from={out}"])
    assert "not a .safetensors file" in exits_2(capsys, "train_video", [*WAN, f"results_dir={tmp_path}", "lora.rank=2",
                                                                         "lora.init_from=missing.safetensors"])
    assert "has no diffusers class" in exits_2(capsys, "train_video", [
        "--config", "configs/video_stdit_demo.yaml", f"results_dir={tmp_path}", "export.diffusers=true"])
    assert "does not write" in exits_2(capsys, "train_video", [*WAN, f"results_dir={tmp_path}",
                                                                "export.diffusers=false", "export.ema=false"])
