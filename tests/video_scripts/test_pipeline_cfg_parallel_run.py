"""sample.py's route with ``sample.cfg_parallel=true`` for a run from a pipeline folder: a 1-step Z-Image LoRA
run sampled on two gloo ranks (each running one guidance branch of ``ZImagePipeline``'s call) gives the
one-process samples (fp32, 1e-5) on both ranks. The branch split itself, for every family that declares
it, is checked cheaply in tests/parallel/test_pipeline_cfg_parallel.py; this is the whole route (config
checks, ``sampling_ranks``' pairs, ``load_trained_pipeline``, ``pipeline_batches``)."""

import pytest
import torch

from opendit_lite.families.tiny_pipelines import TINY_CALLS
from tests.distributed import run_distributed
from tests.pipeline_runs import write_csv, write_image
from tests.video_scripts.test_family_scripts import main
from tests.video_scripts.test_pipeline_sampling import PROMPTS


def sampled(args) -> torch.Tensor:
    """The images [N, 3, 1, H, W] sample.py samples for ``args`` on this process (or rank)."""
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.sampling import sampling_ranks
    from opendit_lite.sampling.pipeline_sampling import (
        check_pipeline_sampling,
        load_trained_pipeline,
        pipeline_batches,
    )
    from opendit_lite.sampling.video import find_video_checkpoint, read_prompts
    from opendit_lite.training.video import validate_video_config

    cfg = load_config(None, list(args), schema=VideoTrainConfig)
    validate_video_config(cfg)
    ckpt = find_video_checkpoint(cfg)
    check_pipeline_sampling(cfg, None, None)
    with sampling_ranks(cfg.sp_size, cfg.sample.cfg_parallel) as ranks:
        pipe = load_trained_pipeline(cfg, ckpt, ranks)
        return torch.cat([clips for _, clips in pipeline_batches(pipe, cfg, read_prompts(cfg), ranks)])


def _on_rank(rank, world_size, args):
    return sampled(args)


@pytest.mark.slow  # two fresh rank processes, each importing diffusers and the package: about 40 s on 2 cores
def test_cfg_parallel_ranks_sample_a_z_image_run_as_one_process(tiny_pipeline, tmp_path):
    folder, size = tiny_pipeline("z_image"), TINY_CALLS["z_image"]["height"]
    media = write_image(tmp_path / "0.png", size, size)
    args = [f"model.pipeline={folder}", "data.type=csv", f"data.path={write_csv(tmp_path, [(media, PROMPTS[0])])}",
            f"data.image_size={size}", "data.frame_interval=1", "precision=fp32", "global_batch_size=1", "lr=5e-3",
            "ckpt_every=0", "lora.rank=4", "lora.alpha=4", "exp_name=lora", f"results_dir={tmp_path}", "logger=[]"]
    main("train_video", [*args, "max_steps=1"])
    sampling = [*args, f"sample.prompts={PROMPTS[:2]}", "sample.num_sampling_steps=2", "sample.cfg_scale=3"]
    one = sampled(sampling)
    ranks = run_distributed(_on_rank, 2, args=([*sampling, "sample.cfg_parallel=true"],), env={"OMP_NUM_THREADS": "1"})
    for images in ranks:
        assert images.shape == one.shape == (2, 3, 1, size, size)
        assert (images - one).abs().max().item() <= 1e-5, (images - one).abs().max().item()
