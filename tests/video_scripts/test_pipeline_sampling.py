"""A run trained from a pipeline folder (``model.pipeline``) samples through that pipeline: sample_video.py
(and sample.py for an image family) load the family's own pipeline class from the folder, put the run's
trained weights in it (a LoRA through the pipeline's ``load_lora_weights``, a full fine-tune's
transformer) and call it with one generator per prompt, seeded by (sample.seed, the prompt's index).
The samples equal, within 1e-5 in fp32, those of the pipeline called directly in one process with the
run's export loaded (``<run>/diffusers/``) and the same generators, whatever the batch size, and
under sequence parallelism (Wan, sp_size=2 on two gloo ranks). Settings the pipeline would ignore or
silently round are refused with exit code 2.

Every other family's LoRA (SD3 with train.py and sample.py; HunyuanVideo, CogVideoX, LTX-Video and Wan 2.2
with both experts, its low-noise expert's adapters loaded with ``load_into_transformer_2``) is trained for
2 steps on captioned media (``data.type: csv``) and sampled by its script, whose written clips equal the
pipeline's own.

Runs: a LoRA on the tiny Wan pipeline (3 steps) and a full fine-tune of the tiny Flux pipeline
(2 steps, train.py), both on latents extracted from their pipeline."""

import os
from unittest import mock

import pytest
import torch

from opendit_lite.diffusion.sampling_utils import SampleGenerators
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from tests.distributed import run_distributed
from tests.pipeline_runs import extracted_latents, write_clip, write_csv, write_image
from tests.video_scripts.test_family_scripts import exits_2, main
from tests.video_scripts.test_lora_export import LoadLog

PROMPTS = ["a red square moving right", "a blue disc", "a green square moving left"]
STEPS = 2


def run_args(pipeline: str, data: str, results: str, exp_name: str, *extra: str):
    return [f"model.pipeline={pipeline}", "data.type=latents", f"data.path={data}", "precision=fp32",
            "global_batch_size=2", "lr=5e-3", "ckpt_every=0", f"exp_name={exp_name}", f"results_dir={results}",
            "logger=[]", *extra]


def sample_args(run, prompts=PROMPTS, *extra: str):
    """sample_video.py's (or sample.py's) command line for the run ``run`` = (pipeline, latents, results, name)."""
    pipeline, data, results, name = run
    return [*run_args(pipeline, data, results, name), f"sample.prompts={list(prompts)}",
            f"sample.num_sampling_steps={STEPS}", *extra]


@pytest.fixture(scope="module")
def wan_lora(tiny_pipeline, tmp_path_factory):
    """A 3-step LoRA run on the tiny Wan pipeline's 5-frame 32-pixel clips, exported by default."""
    root = tmp_path_factory.mktemp("wan_lora")
    pipeline = tiny_pipeline("wan")
    call = TINY_CALLS["wan"]
    data = extracted_latents(pipeline, root, PROMPTS[:2], frames=call["num_frames"], size=call["height"])
    main("train_video", [*run_args(pipeline, data, str(root), "lora"), "max_steps=3", "lora.rank=4", "lora.alpha=4"])
    return pipeline, data, str(root), "lora"


@pytest.fixture(scope="module")
def flux_full(tiny_pipeline, tmp_path_factory):
    """A 2-step full fine-tune of the tiny Flux pipeline's transformer on 32-pixel images (train.py)."""
    root = tmp_path_factory.mktemp("flux_full")
    pipeline = tiny_pipeline("flux")
    data = extracted_latents(pipeline, root, PROMPTS[:2], frames=1, size=TINY_CALLS["flux"]["height"])
    main("train", [*run_args(pipeline, data, str(root), "full"), "max_steps=2"])
    return pipeline, data, str(root), "full"


def sampled(args, sp_size: int = 1) -> torch.Tensor:
    """The clips [N, 3, T, H, W] in [-1, 1] that sample_video.py samples for ``args``, in this process
    (or this rank: every rank of one sequence-parallel group holds them)."""
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.sampling import sampling_ranks
    from opendit_lite.sampling.pipeline_sampling import load_trained_pipeline, pipeline_batches
    from opendit_lite.sampling.video import find_video_checkpoint, read_prompts
    from opendit_lite.training.video import validate_video_config

    cfg = load_config(None, [*args, f"sp_size={sp_size}"], schema=VideoTrainConfig)
    validate_video_config(cfg)
    ckpt = find_video_checkpoint(cfg)
    with sampling_ranks(cfg.sp_size) as ranks:
        pipe = load_trained_pipeline(cfg, ckpt, ranks)
        return torch.cat([clips for _, clips in pipeline_batches(pipe, cfg, read_prompts(cfg), ranks)])


def direct(pipe, prompts=PROMPTS, seed: int = 0, **call) -> torch.Tensor:
    """The pipeline called directly on every prompt at once, prompt i's noise from generator (seed, i):
    [N, 3, T, H, W] in [-1, 1]."""
    from opendit_lite.sampling.pipeline_sampling import pipeline_pixels

    generators = SampleGenerators(seed, range(len(prompts))).generators
    with torch.no_grad():
        return pipeline_pixels(pipe(prompt=list(prompts), generator=generators, output_type="pt", **call)).float()


def wan_reference(run, lora: bool = True) -> torch.Tensor:
    from diffusers import WanPipeline

    pipeline, _, results, name = run
    pipe = WanPipeline.from_pretrained(pipeline)
    if lora:
        with LoadLog() as log:
            pipe.load_lora_weights(os.path.join(results, name, "diffusers"))
        assert not log.key_warnings(), log.text()
    return direct(pipe, num_inference_steps=STEPS, **{k: v for k, v in TINY_CALLS["wan"].items()
                                                        if k != "num_inference_steps"})


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def test_a_lora_run_samples_what_its_pipeline_gives_with_the_exported_lora(wan_lora):
    ours = sampled(sample_args(wan_lora, PROMPTS, "sample.batch_size=2"))  # batches of 2 and 1
    reference = wan_reference(wan_lora)
    assert ours.shape == (3, 3, 5, 32, 32)
    assert _max_diff(ours, reference) <= 1e-5, _max_diff(ours, reference)
    assert _max_diff(reference, wan_reference(wan_lora, lora=False)) > 1e-5  # the LoRA changes the samples


def _sample_on_rank(rank, world_size, args):
    return sampled(args, sp_size=2)


@pytest.mark.slow  # two fresh rank processes, each importing diffusers and the package: about 30 s on 2 cores
def test_sequence_parallel_sampling_gives_the_one_process_samples(wan_lora):
    serial = wan_reference(wan_lora)
    results = run_distributed(_sample_on_rank, 2, args=(sample_args(wan_lora, PROMPTS[:2]),),
                              env={"OMP_NUM_THREADS": "1"})
    for clips in results:  # both ranks of the group hold the samples
        assert _max_diff(clips, serial[:2]) <= 1e-5, _max_diff(clips, serial[:2])


def test_sample_py_samples_a_flux_fine_tune_through_its_pipeline(flux_full, capsys):
    from diffusers import FluxPipeline

    pipeline, _, results, name = flux_full
    ours = sampled(sample_args(flux_full))
    exported = FluxPipeline.from_pretrained(os.path.join(results, name, "diffusers"))  # the full fine-tune's export
    reference = direct(exported, num_inference_steps=STEPS, height=32, width=32)
    assert ours.shape == (3, 3, 1, 32, 32)
    assert _max_diff(ours, reference) <= 1e-5, _max_diff(ours, reference)
    base = direct(FluxPipeline.from_pretrained(pipeline), num_inference_steps=STEPS, height=32, width=32)
    assert _max_diff(reference, base) > 1e-5  # the trained transformer, not the pipeline's own
    paths = main("sample", sample_args(flux_full))
    assert [os.path.basename(p) for p in paths] == ["00_a_red_square_moving_right.png", "01_a_blue_disc.png",
                                                    "02_a_green_square_moving_left.png", "contact_sheet.png"]
    assert "through FluxPipeline" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["sample.prompts=[]"], "'sample.prompts' is an empty list"),
    (["sample.sampler=euler"], "remove sample.sampler"),
    (["sample.num_frames=4"], "4 x n + 1 frames"),
    (["sample.height=36"], "ask for 36 pixels: use a multiple of 8"),
    (["sample.cfg_parallel=true"], "give the scale they are combined at, sample.cfg_scale"),
    (["sample.cache.kind=pab"], "sample.cache applies to this library's own sampler only"),
])
def test_settings_the_pipeline_would_ignore_or_round_exit_2(wan_lora, capsys, extra, message):
    capsys.readouterr()  # the fixture's run
    err = exits_2(capsys, "sample_video", [*sample_args(wan_lora), *extra])
    assert message in err, err


def test_a_run_sampled_with_another_pipeline_folder_or_script_exits_2(wan_lora, tiny_pipeline, tmp_path, capsys):
    pipeline, data, results, name = wan_lora
    other = tiny_pipeline("wan22")
    capsys.readouterr()  # the fixtures' runs
    args = [a if not a.startswith("model.pipeline=") else f"model.pipeline={other}" for a in sample_args(wan_lora)]
    args = [a for a in args if not a.startswith("data.")] + ["data.type=csv", "data.num_frames=5", "data.image_size=32",
                                                               f"data.path={write_csv(tmp_path, [('a.mp4', 'a')])}"]
    err = exits_2(capsys, "sample_video", [*args, f"sample.ckpt={results}/{name}/checkpoints/{name}_step3"])
    assert "was trained from the pipeline folder" in err and "sample with the folder it trained" in err
    err = exits_2(capsys, "sample", sample_args(wan_lora))
    assert "sample it with sample_video.py" in err


# family -> the diffusers pipeline class its released model loads with (the reference called directly)
PIPELINES = {"sd3": "StableDiffusion3Pipeline", "hunyuanvideo": "HunyuanVideoPipeline",
             "cogvideox": "CogVideoXPipeline", "ltx": "LTXPipeline", "wan22": "WanPipeline", "flux2": "Flux2Pipeline",
             "qwenimage": "QwenImagePipeline"}


def script_clips(name: str, args):
    """The clips [N, 3, T, H, W] in [-1, 1] that the script ``name`` (sample or sample_video) writes."""
    from opendit_lite.sampling import video

    written = []

    def recording(write, images: bool):
        def record(clips, *rest, **kwargs):
            written.append(clips[:, :, None] if images else clips)  # images [N, 3, H, W] as 1-frame clips
            return write(clips, *rest, **kwargs)
        return record

    with mock.patch.object(video, "write_videos", recording(video.write_videos, False)), \
            mock.patch.object(video, "write_images", recording(video.write_images, True)):
        main(name, args)
    return torch.cat(written)


@pytest.mark.parametrize("family", list(PIPELINES))
def test_every_family_s_lora_run_samples_through_its_pipeline_with_the_exported_lora(family, tiny_pipeline, tmp_path):
    import diffusers

    folder, call = tiny_pipeline(family), dict(TINY_CALLS[family])
    steps = call.pop("num_inference_steps")  # Wan 2.2: 3 steps, the last one below the boundary (transformer_2)
    frames, size = call.get("num_frames", 1), call["height"]
    media = write_image(tmp_path / "0.png", size, size) if frames == 1 else write_clip(tmp_path / "0.mp4", frames, size,
                                                                                          size)
    args = [f"model.pipeline={folder}", "data.type=csv", f"data.path={write_csv(tmp_path, [(media, PROMPTS[0])])}",
            f"data.image_size={size}", *([f"data.num_frames={frames}"] if frames > 1 else []), "data.frame_interval=1",
            "precision=fp32", "global_batch_size=1", "lr=5e-3", "ckpt_every=0", "lora.rank=4", "lora.alpha=4",
            "exp_name=lora", f"results_dir={tmp_path}", "logger=[]"]
    main("train" if frames == 1 else "train_video", [*args, "max_steps=2"])
    ours = script_clips("sample" if frames == 1 else "sample_video",
                        [*args, f"sample.prompts={PROMPTS[:2]}", f"sample.num_sampling_steps={steps}"])

    pipe = getattr(diffusers, PIPELINES[family]).from_pretrained(folder)
    base = direct(pipe, PROMPTS[:2], num_inference_steps=steps, **call)
    exported = os.path.join(str(tmp_path), "lora", "diffusers")
    with LoadLog() as log:
        pipe.load_lora_weights(exported)
    assert not log.key_warnings(), log.text()
    reference = direct(pipe, PROMPTS[:2], num_inference_steps=steps, **call)
    if family == "wan22":  # the low-noise expert's adapters, written beside the high-noise expert's
        high_only = reference
        pipe.load_lora_weights(os.path.join(exported, "transformer_2"), load_into_transformer_2=True)
        reference = direct(pipe, PROMPTS[:2], num_inference_steps=steps, **call)
        assert _max_diff(reference, high_only) > 1e-5  # transformer_2 ran with its trained adapters
    assert ours.shape == (2, 3, frames, size, size)
    assert _max_diff(ours, reference) <= 1e-5, _max_diff(ours, reference)
    assert _max_diff(reference, base) > 1e-5  # the LoRA changes the samples
