"""train_video.py on a Wan 2.2 A14B pipeline folder (``model.pipeline``: the tiny one, two experts and
boundary_ratio, trained on latents extracted from it): LoRA on both experts in one run (each sample
to the expert of its time), both checkpointed and resumed to the same weights and EMA, both exported
as the pipeline's LoRA files that WanPipeline loads (transformer_2's with load_into_transformer_2)
with no warning and the trained experts' outputs; a full fine-tune exports a pipeline folder (the
experts written fresh, the other components linked) that DiffusionPipeline.from_pretrained loads,
also after the run folder moved; one expert alone trains (on its own noise range) and exports by
itself; model.expert without two experts exits 2."""

import os
import shutil

import pytest
import torch

from opendit_lite.checkpoint.layout import find_resume_checkpoint, saved_config
from opendit_lite.checkpoint.weights import read_weights
from tests.video_scripts.test_family_scripts import exits_2, main
from tests.video_scripts.test_lora_export import LoadLog, wan_latents

LORA = "pytorch_lora_weights.safetensors"


def run_args(pipeline: str, data: str, results: str, steps: int, *extra):
    return [f"model.pipeline={pipeline}", "data.type=latents", f"data.path={data}", "precision=fp32",
            f"max_steps={steps}", "global_batch_size=2", "lr=5e-3", "log_every=1", "ckpt_every=2", "exp_name=e",
            f"results_dir={results}", "logger=[]", *extra]


def final_checkpoint(run: str) -> str:
    return find_resume_checkpoint(os.path.join(run, "checkpoints"), os.path.basename(run))


@pytest.fixture(scope="module")
def wan22(tiny_pipeline, tmp_path_factory):
    root = tmp_path_factory.mktemp("experts")
    pipeline = tiny_pipeline("wan22")
    return pipeline, wan_latents(pipeline, root), root


@pytest.fixture(scope="module")
def lora_run(wan22):
    pipeline, data, root = wan22
    main("train_video", run_args(pipeline, data, str(root / "lora"), 4, "lora.rank=2", "lora.alpha=4"))
    return os.path.join(root, "lora", "e")


def test_both_experts_train_with_lora_and_resume_to_the_same_state(wan22, lora_run):
    import yaml

    pipeline, data, root = wan22
    assert yaml.safe_load(open(os.path.join(lora_run, "config.yaml")))["model"]["expert"] == "both"
    final = final_checkpoint(lora_run)
    trained = read_weights(final, use_ema=False)
    for expert in ("transformer", "transformer_2"):  # each expert's adapters moved from their zero start
        b = [v for k, v in trained.items() if k.startswith(expert + ".") and ".lora_B." in k]
        assert b and max(v.abs().max().item() for v in b) > 0, expert
    middle = os.path.join(lora_run, "checkpoints", "e_step2")
    main("train_video", run_args(pipeline, data, str(root / "resumed"), 4, "lora.rank=2", "lora.alpha=4",
                                 f"resume_from={middle}", "export.diffusers=false"))
    resumed = final_checkpoint(os.path.join(root, "resumed", "e"))
    for use_ema in (False, True):
        a, b = read_weights(final, use_ema=use_ema), read_weights(resumed, use_ema=use_ema)
        assert a.keys() == b.keys()
        worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
        assert worst < 1e-6, (use_ema, worst)


def test_both_experts_export_as_lora_files_the_pipeline_loads(wan22, lora_run):
    from diffusers import WanPipeline

    from opendit_lite.builders.lora_checkpoint import load_merged
    from opendit_lite.models.experts import NoiseExperts
    from tests.diffusers_families import forward_inputs

    pipeline, _, _ = wan22
    out = os.path.join(lora_run, "diffusers")
    assert sorted(os.listdir(out)) == ["comfyui_lora.safetensors", LORA, "transformer_2"]  # both formats: Wan
    assert sorted(os.listdir(os.path.join(out, "transformer_2"))) == ["comfyui_lora.safetensors", LORA]
    pipe = WanPipeline.from_pretrained(pipeline)
    with LoadLog() as log:
        pipe.load_lora_weights(out)
        pipe.load_lora_weights(os.path.join(out, "transformer_2"), load_into_transformer_2=True)
    assert not log.text(), log.text()
    # the EMA experts of the final checkpoint, merged, as the reference
    fresh = WanPipeline.from_pretrained(pipeline)
    ckpt = final_checkpoint(lora_run)
    reference = load_merged(NoiseExperts(fresh.transformer, fresh.transformer_2, 875.0), ckpt, use_ema=True,
                            lora=saved_config(ckpt)["lora"])
    inputs = forward_inputs("WanTransformer3DModel")
    inputs["hidden_states"] = torch.randn(2, 16, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for name in ("transformer", "transformer_2"):
            got, want = getattr(pipe, name)(**inputs)[0], getattr(reference, name)(**inputs)[0]
            base = getattr(WanPipeline.from_pretrained(pipeline), name)(**inputs)[0]
            assert (got - want).abs().max() < 1e-5 and (want - base).abs().max() > 1e-6, name


def test_a_full_fine_tune_exports_a_pipeline_folder_with_the_rest_linked(wan22, tmp_path):
    from diffusers import DiffusionPipeline

    pipeline, data, _ = wan22
    main("train_video", run_args(pipeline, data, str(tmp_path), 1))
    run = os.path.join(tmp_path, "e")
    out = os.path.join(run, "diffusers")
    for name in ("transformer", "transformer_2"):  # written fresh
        assert os.path.isdir(os.path.join(out, name)) and not os.path.islink(os.path.join(out, name))
    for name in ("vae", "text_encoder", "tokenizer", "scheduler"):  # linked to the source, not copied
        link = os.path.join(out, name)
        assert os.path.islink(link) and os.readlink(link) == os.path.realpath(os.path.join(pipeline, name))
    ema = read_weights(final_checkpoint(run), use_ema=True)
    moved = str(tmp_path / "elsewhere")
    shutil.copytree(out, moved, symlinks=True)  # the run folder moved: absolute links still resolve
    shutil.rmtree(out)
    pipe = DiffusionPipeline.from_pretrained(moved)
    assert type(pipe).__name__ == "WanPipeline" and pipe.config.boundary_ratio == 0.875
    for name in ("transformer", "transformer_2"):
        state = getattr(pipe, name).state_dict()
        assert all(torch.equal(v, ema[f"{name}.{k}"].float()) for k, v in state.items()), name


def test_one_expert_alone_trains_and_exports_by_itself(wan22, tmp_path, capsys):
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.training.video import prepare_video_data, validate_video_config

    pipeline, data, _ = wan22
    args = run_args(pipeline, data, str(tmp_path), 1, "lora.rank=2", "model.expert=low_noise")
    cfg = load_config(None, args, schema=VideoTrainConfig)
    validate_video_config(cfg)
    objective = prepare_video_data(cfg, torch.device("cpu")).objective((2, 16, 1, 4, 4))
    assert objective.time_range == (0.0, 0.875)  # times of the low-noise range only
    main("train_video", args)
    run = os.path.join(tmp_path, "e")
    assert not any(k.startswith("transformer") for k in read_weights(final_checkpoint(run), use_ema=False))
    out = os.path.join(run, "diffusers")
    assert os.listdir(out) == ["transformer_2"]
    assert sorted(os.listdir(os.path.join(out, "transformer_2"))) == ["comfyui_lora.safetensors", LORA]
    capsys.readouterr()
    err = exits_2(capsys, "train_video", run_args(pipeline, data, str(tmp_path), 1, "model.expert=high_noise",
                                                  "model.pipeline=null", f"model.path={pipeline}/transformer"))
    assert "model.expert=high_noise chooses between the two experts" in err
