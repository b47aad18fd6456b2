"""What a run from a pipeline folder refuses, each with exit code 2 and one paragraph saying what to do
(no traceback): a folder that is not a pipeline, a pipeline of another family than model.name, a text
encoder without its tokenizer, a frame count or size its VAE and patches do not take, latents of another
pipeline or size (or a pipeline's latents without the pipeline), any caption encoder, VAE or model
source other than the pipeline's, the shapes data, a guidance value for a model without a guidance
embedding, model.expert for a pipeline without two experts, a video pipeline given to train.py; and
the routes that trained a family silently wrong without it."""

import json
import os
import shutil

import pytest

from tests.pipeline_runs import write_csv
from tests.video_scripts.test_family_scripts import exits_2


@pytest.fixture(scope="module")
def csv(tmp_path_factory):
    return write_csv(tmp_path_factory.mktemp("csv"), [("a.mp4", "a red square")])


def _args(folder, csv, *extra):
    return [f"model.pipeline={folder}", "data.type=csv", f"data.path={csv}", "data.num_frames=5",
            "data.image_size=32", *extra]


def test_folders_that_are_not_a_whole_pipeline(tiny_pipeline, csv, tmp_path, capsys):
    wan, flux = tiny_pipeline("wan"), tiny_pipeline("flux")
    capsys.readouterr()  # building a pipeline shows progress
    assert "is not a folder" in exits_2(capsys, "train_video", _args(tmp_path / "none", csv))
    err = exits_2(capsys, "train_video", _args(os.path.join(wan, "transformer"), csv))
    assert "holds no model_index.json" in err and "one model's folder" in err
    flux = shutil.copytree(flux, tmp_path / "flux")
    for name in os.listdir(flux / "tokenizer_2"):
        os.remove(flux / "tokenizer_2" / name)
    err = exits_2(capsys, "train_video", _args(flux, csv, "data.num_frames=1"))
    assert "text encoder text_encoder_2/ but no tokenizer" in err and "unknown tokens" in err


@pytest.mark.parametrize("extra, expected", [
    (["model.name=FluxTransformer2DModel"], "but model.name is FluxTransformer2DModel"),
    (["model.name=STDiT-tiny"], "but model.name is STDiT-tiny"),
    (["data.num_frames=6"], "encodes 4 x n + 1 frames"),
    (["data.image_size=36"], "whole 8-pixel patches"),
    (["text_encoder.kind=shapes"], "text_encoder.kind='shapes'"),
    (["text_encoder.kind=t5", "text_encoder.path=/models/t5"], "text_encoder.kind='t5'"),
    (["text_encoder.max_length=226"], "gives its transformer 512 caption tokens"),
    (["vae.path=/models/vae"], "remove vae.path"),
    (["model.config={num_layers: 1}"], "remove model.path and model.config"),
    (["data.type=shapes", "data.path=null"], "set data.type=csv"),
    (["model.guidance=4.0"], "has none: remove model.guidance"),
    (["encoder.fsdp=true"], "remove encoder.fsdp"),
])
def test_settings_that_would_train_on_conditions_the_pipeline_never_produces(tiny_pipeline, csv, capsys, extra,
                                                                              expected):
    wan = tiny_pipeline("wan")
    capsys.readouterr()
    err = exits_2(capsys, "train_video", _args(wan, csv, *extra))
    assert expected in err


def test_an_expert_of_one_transformer_and_video_pipelines_in_train_py(tiny_pipeline, csv, capsys):
    wan = tiny_pipeline("wan")
    capsys.readouterr()
    err = exits_2(capsys, "train_video", _args(wan, csv, "model.expert=low_noise"))
    assert "chooses between the two experts" in err and "has one" in err
    err = exits_2(capsys, "train", [f"model.pipeline={wan}"])
    assert "train it with train_video.py" in err


def test_latents_of_another_pipeline_or_size(tiny_pipeline, tmp_path, capsys):
    from opendit_lite.encoders.pipeline_folder import pipeline_fingerprint

    wan = tiny_pipeline("wan")
    capsys.readouterr()
    folder = tmp_path / "latents"
    folder.mkdir()
    meta = {"format": "pipeline", "pipeline": "/elsewhere/wan", "fingerprint": "0123456789abcdef",
            "files": {"00000000.pt": [5, 32, 32]}, "pixel_sizes": [[5, 32, 32]]}
    (folder / "meta.json").write_text(json.dumps(meta))
    args = [f"model.pipeline={wan}", "data.type=latents", f"data.path={folder}"]
    err = exits_2(capsys, "train_video", args)
    assert "extracted from the pipeline '/elsewhere/wan'" in err and "extract them again" in err
    (folder / "meta.json").write_text(json.dumps({**meta, "fingerprint": pipeline_fingerprint(wan)}))
    err = exits_2(capsys, "train_video", [*args, "data.num_frames=9"])
    assert "extracted at 5x32x32 pixels" in err and "9x?x?" in err
    err = exits_2(capsys, "train_video", ["--config", "configs/wan_tiny_demo.yaml", "data.type=latents",
                                          f"data.path={folder}", f"results_dir={tmp_path}"])  # without the pipeline
    assert "train them with model.pipeline=/elsewhere/wan" in err
    (folder / "meta.json").write_text(json.dumps({"transformer": "WanTransformer3DModel"}))
    assert "no latents extracted from a pipeline" in exits_2(capsys, "train_video", args)


def test_a_family_without_its_pipeline_no_longer_takes_an_image_vae_or_a_tokenizer_less_encoder(tiny_pipeline,
                                                                                                 tmp_path, capsys):
    from opendit_lite.encoders.text import load_text_encoder

    flux = tiny_pipeline("flux")
    capsys.readouterr()
    err = exits_2(capsys, "train_video", ["--config", "configs/wan_tiny_demo.yaml", "vae.path=/models/sd-vae"])
    assert "set model.pipeline" in err and "vae.scale_factor" in err
    with pytest.raises(FileNotFoundError, match="holds no tokenizer .* unknown tokens"):
        load_text_encoder("t5", os.path.join(flux, "text_encoder_2"), 8)
