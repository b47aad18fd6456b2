"""scripts/extract_latents.py --family: each family's own tiny VAE and text encoder (saved as a
pipeline folder), clips from a CSV, latents normalised as the family's pipeline expects (checked
against the normalisation written out here), caption states of its text encoder, files the video
latent dataset reads; two gloo ranks share the rows and give the one-rank files; bad inputs end
with exit 2 and one paragraph."""

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from opendit_lite.data.video_latents import VideoLatentDataset
from tests.distributed import run_distributed
from tests.family_assets import VAES, save_tiny_pipeline, tiny_text_model, tiny_vae
from tests.pipeline_runs import extract_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPTIONS = ("a red square moving left", "a blue disc", "green disc moving up fast")


_script = extract_script


def _write_video(path, frames: int, height: int = 20, width: int = 28):
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            img = np.full((height, width, 3), 30 + i * 25, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _csv(folder, video: bool = False) -> str:
    """A CSV of three clips: images (1-frame clips), or for ``video`` 5-frame videos."""
    os.makedirs(folder, exist_ok=True)
    names = []
    for i in range(len(CAPTIONS)):
        if video:
            _write_video(os.path.join(folder, f"{i}.mp4"), frames=5 + i)
            names.append(f"{i}.mp4")
            continue
        rng = np.random.default_rng(i)
        Image.fromarray(rng.integers(0, 255, (20, 28, 3), dtype=np.uint8)).save(os.path.join(folder, f"{i}.png"))
        names.append(f"{i}.png")
    rows = "".join(f"{name},{caption}\n" for name, caption in zip(names, CAPTIONS))
    path = os.path.join(folder, "clips.csv")
    with open(path, "w") as f:
        f.write("path,text\n" + rows)
    return path


def _pipeline_normalisation(family: str, vae, z: torch.Tensor) -> torch.Tensor:
    """The inverse of the family pipeline's decode step, written out per family."""
    c = vae.config
    if family == "wan":    # WanPipeline: latents / (1 / std) + mean
        mean, std = torch.tensor(c.latents_mean).view(1, -1, 1, 1, 1), torch.tensor(c.latents_std).view(1, -1, 1, 1, 1)
        return (z - mean) / std
    if family == "ltx":    # LTXPipeline._denormalize_latents: latents * std / scaling + mean
        mean, std = vae.latents_mean.view(1, -1, 1, 1, 1), vae.latents_std.view(1, -1, 1, 1, 1)
        return (z - mean) * c.scaling_factor / std
    if family in ("flux", "sd3"):  # latents / scaling + shift
        return (z - c.shift_factor) * c.scaling_factor
    return z * c.scaling_factor    # CogVideoX, HunyuanVideo: latents / scaling


@pytest.mark.parametrize("family", list(VAES))
def test_each_family_stores_the_latents_and_states_its_pipeline_expects(family, tmp_path):
    from transformers import AutoTokenizer

    from opendit_lite.data.video_csv import VideoCSVDataset
    from opendit_lite.families import find_family
    from tests.family_assets import TEXT_MODELS

    pipeline = save_tiny_pipeline(tmp_path / "pipeline", family)
    csv = _csv(tmp_path / "data")
    out = str(tmp_path / "latents")
    count = _script().main(["--family", family, "--csv", csv, "--pipeline-path", pipeline, "--num-frames", "1",
                            "--height", "16", "--width", "24", "--max-length", "6", "--mode", "--batch-size", "2",
                            "--num-workers", "0", "--output", out])
    assert count == 3
    meta = json.loads(open(os.path.join(out, "meta.json")).read())
    # hunyuanvideo and ltx are aliases of hunyuan_video and ltx_video: the meta names the family
    assert meta["family"] == find_family(family).name and meta["count"] == 3 and meta["text_tokens"] == 6

    dataset = VideoLatentDataset(out)
    vae, text = tiny_vae(family), tiny_text_model(TEXT_MODELS.get(family, "t5"))
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(pipeline, find_family(family).encoding.text_folders[1]))
    for i in range(3):
        latents, states, mask, caption = dataset[i]
        clip, expected_caption = VideoCSVDataset(csv, num_frames=1, image_size=16, random_start=False)[(i, 1, 16, 24)]
        x = clip[None] if family not in ("flux", "sd3") else clip[None, :, 0]
        with torch.no_grad():
            z = vae.encode(x).latent_dist.mode()
        z = z if z.dim() == 5 else z.unsqueeze(2)
        assert caption == expected_caption
        assert latents.shape == z.shape[1:] and list(latents.shape) == meta["latent_shape"]
        torch.testing.assert_close(latents, _pipeline_normalisation(family, vae, z)[0], atol=1e-5, rtol=1e-5)
        words = len(caption.split())
        assert mask.tolist() == [True] * min(words, 6) + [False] * (6 - min(words, 6))
        tokens = tokenizer([caption], max_length=6, padding="max_length", truncation=True, return_tensors="pt")
        with torch.no_grad():
            expected = text(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state[0]
        assert states.shape == (6, 16)
        torch.testing.assert_close(states, expected)


def _two_ranks(rank, world, argv):
    return _script().main(argv)


@pytest.mark.slow  # two spawned ranks importing diffusers and transformers: ~30-45 s on 2 busy cores
def test_two_ranks_share_the_rows_and_write_what_one_rank_writes(tmp_path):
    pipeline = save_tiny_pipeline(tmp_path / "pipeline", "cogvideox")
    csv = _csv(tmp_path / "data", video=True)
    argv = ["--family", "CogVideoXTransformer3DModel", "--csv", csv, "--pipeline-path", pipeline, "--num-frames", "5",
            "--height", "16", "--width", "16", "--mode", "--batch-size", "1", "--num-workers", "0"]
    one = str(tmp_path / "one")
    assert _script().main(argv + ["--output", one]) == 3
    two = str(tmp_path / "two")
    assert run_distributed(_two_ranks, world_size=2, args=(argv + ["--output", two],)) == [3, 3]
    assert sorted(os.listdir(one)) == sorted(os.listdir(two)) == ["00000000.pt", "00000001.pt", "00000002.pt",
                                                                  "meta.json"]
    a, b = VideoLatentDataset(one), VideoLatentDataset(two)
    for i in range(3):
        for x, y in zip(a[i][:3], b[i][:3]):
            torch.testing.assert_close(x, y)
    assert a[0][0].shape == (4, 3, 8, 8)  # 5 frames of 16 x 16 pixels (the tiny VAE: 1 + (5 - 1) / 2 latent frames)


def _expect_exit_2(argv, message, capsys):
    capsys.readouterr()  # what setting up the folders printed
    with pytest.raises(SystemExit) as exit_info:
        _script().main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def _bad_inputs(tmp_path):
    csv = _csv(tmp_path / "data")
    wan = save_tiny_pipeline(tmp_path / "wan", "wan")
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLWan"}))
    torch.save({"x": torch.zeros(1)}, str(pickled / "diffusion_pytorch_model.bin"))
    (tmp_path / "file").write_text("x")
    (tmp_path / "config.yaml").write_text("model:\n  input_size: [8]\n")
    text = os.path.join(wan, "text_encoder")
    hunyuan_vae = str(tmp_path / "hunyuan-vae")
    tiny_vae("hunyuanvideo").save_pretrained(hunyuan_vae)
    base = ["--csv", csv, "--output", str(tmp_path / "out")]
    return {
        "unknown family": (["--family", "wann", "--pipeline-path", wan] + base, "unknown family 'wann'"),
        "missing csv": (["--family", "wan", "--pipeline-path", wan, "--csv", "nope.csv", "--output", "o"],
                        "is not a file"),
        "vae folder without config": (["--family", "wan", "--vae-path", str(no_config), "--text-encoder-path", text]
                                      + base, "has no config.json"),
        "pickled vae": (["--family", "wan", "--vae-path", str(pickled), "--text-encoder-path", text] + base,
                        "only pickled weights"),
        "another family's vae": (["--family", "cogvideox", "--vae-path", os.path.join(wan, "vae"),
                                  "--text-encoder-path", text] + base,
                                 "encodes with a diffusers AutoencoderKLCogVideoX"),
        "another family's text encoder": (["--family", "hunyuanvideo", "--vae-path", hunyuan_vae,
                                           "--text-encoder-path", text] + base, "encodes captions with llama"),
        "output is a file": (["--family", "wan", "--pipeline-path", wan, "--csv", csv, "--output",
                              str(tmp_path / "file")], "is an existing file"),
        "config without model.name": (["--config", str(tmp_path / "config.yaml"), "--pipeline-path", wan] + base,
                                      "has no model.name"),
        "no encoders": (["--family", "wan"] + base, "needs the VAE and the text encoder"),
        "zero frames": (["--family", "wan", "--pipeline-path", wan, "--num-frames", "0"] + base,
                        "--num-frames must be at least 1"),
        "csv without family": (["--csv", csv, "--output", "o"], "need --family"),
    }


BAD_INPUTS = ("unknown family", "missing csv", "vae folder without config", "pickled vae", "another family's vae",
              "another family's text encoder", "output is a file", "config without model.name", "no encoders",
              "zero frames", "csv without family")


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_exit_2_with_one_paragraph(case, tmp_path, capsys):
    argv, message = _bad_inputs(tmp_path)[case]
    _expect_exit_2(argv, message, capsys)
    assert not (tmp_path / "out").exists()


def test_the_image_mode_refuses_bad_folders_too(tmp_path, capsys):
    _expect_exit_2(["--data-path", str(tmp_path / "none"), "--vae-path", "v", "--output", "o"], "is not a folder",
                   capsys)
    (tmp_path / "images").mkdir()
    _expect_exit_2(["--data-path", str(tmp_path / "images"), "--vae-path", str(tmp_path / "images"), "--output", "o"],
                   "has no config.json", capsys)


def test_train_video_trains_a_family_on_the_extracted_latents(tmp_path):
    import diffusers
    import yaml

    from tests.video_scripts.test_family_scripts import main

    pipeline = save_tiny_pipeline(tmp_path / "pipeline", "wan")
    latents = str(tmp_path / "latents")
    _script().main(["--family", "wan", "--csv", _csv(tmp_path / "data", video=True), "--pipeline-path", pipeline,
                    "--num-frames", "5", "--height", "16", "--width", "16", "--max-length", "8", "--num-workers", "0",
                    "--output", latents])
    config = {"exp_name": "wl", "precision": "fp32", "max_steps": 1, "global_batch_size": 2, "ckpt_every": 0,
              "model": {"name": "WanTransformer3DModel", "config": {
                  "patch_size": [1, 2, 2], "num_attention_heads": 2, "attention_head_dim": 8, "in_channels": 4,
                  "out_channels": 4, "text_dim": 16, "freq_dim": 32, "ffn_dim": 32, "num_layers": 1,
                  "rope_max_seq_len": 32}},
              "data": {"type": "latents", "path": latents}, "text_encoder": {"kind": "shapes", "max_length": 8}}
    (tmp_path / "wan.yaml").write_text(yaml.safe_dump(config))
    main("train_video", ["--config", str(tmp_path / "wan.yaml"), f"results_dir={tmp_path / 'runs'}"])
    saved = yaml.safe_load(open(tmp_path / "runs" / "wl" / "config.yaml"))
    assert saved["model"]["num_frames"] == 5 and saved["model"]["caption_channels"] == 16
    diffusers.WanTransformer3DModel.from_pretrained(str(tmp_path / "runs" / "wl" / "diffusers"))


def test_latents_made_for_another_family_are_refused(tmp_path, capsys):
    from opendit_lite.data.video_latents import save_video_latents, write_video_latent_meta
    from tests.video_scripts.test_family_scripts import exits_2

    folder = str(tmp_path / "flux-latents")
    save_video_latents(folder, 0, torch.zeros(4, 1, 8, 8), torch.zeros(8, 32), torch.ones(8, dtype=torch.bool), "a")
    write_video_latent_meta(folder, {"family": "flux", "transformer": "FluxTransformer2DModel"})
    err = exits_2(capsys, "train_video", ["--config", "configs/wan_tiny_demo.yaml", f"results_dir={tmp_path}",
                                          "data.type=latents", f"data.path={folder}", "max_steps=1"])
    assert "were extracted for FluxTransformer2DModel" in err and err.count("\n") == 1
