"""CFG-parallel sampling through a family's pipeline (``sampling/pipeline_cfg_parallel.py``): on two gloo ranks
(the shared 2-rank spawn), each rank's transformer computes one guidance branch of the tiny pipeline's own
``__call__`` and the latents it returns equal the pipeline called directly in the same process (fp32,
1e-5; 2 steps: the first call of a new shape is computed by both ranks, the second step is split), for the
ways the families' pipelines run classifier-free guidance: two transformer calls per step (Qwen-Image's
``true_cfg_scale`` with the empty negative prompt, the scale sample.py passes; HunyuanVideo 1.5's guider's
two batches; Wan) and one call on 2B rows (Z-Image's per-sample lists; SD3, CogVideoX and LTX-Video).

In one process: the run's checks refuse, with exit-code-2 errors that name why, a guidance-distilled model
(FLUX.2), a guidance-distilled Turbo folder, no sample.cfg_scale and a scale without an unconditional
branch; a pipeline that does not follow the pattern its family declares is refused at its call."""

import warnings
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results

PROMPTS = ["a red square", "a blue disc"]
# tiny pipeline -> the keywords of its guided call (Qwen-Image: what pipeline_call_settings passes at scale 2)
CASES = {"qwenimage": dict(height=32, width=32, true_cfg_scale=2.0, negative_prompt=""),
         "hunyuanvideo15": dict(height=32, width=32, num_frames=5),
         "z_image": dict(height=32, width=32, guidance_scale=3.0),
         "wan": dict(height=32, width=32, num_frames=5, guidance_scale=5.0),
         "sd3": dict(height=32, width=32, guidance_scale=5.0),
         "cogvideox": dict(height=32, width=32, num_frames=9, guidance_scale=6.0),
         "ltx": dict(height=32, width=32, num_frames=9, guidance_scale=3.0)}
MODES = {"qwenimage": "two_calls", "hunyuanvideo15": "two_calls", "z_image": "batched", "wan": "two_calls",
         "sd3": "batched", "cogvideox": "batched", "ltx": "batched"}
# Qwen-Image's call without its unconditional branch: true CFG must change the latents (the other two show
# their two branches by the rows each rank computes)
UNGUIDED = dict(true_cfg_scale=1.0, negative_prompt=None)
TOL = 1e-5


def _latents(pipe, **call) -> torch.Tensor:
    generators = [torch.Generator().manual_seed(i) for i in range(len(PROMPTS))]
    with torch.no_grad():
        # a copy: ZImagePipeline writes its chat template into the prompt list it is given
        out = pipe(prompt=list(PROMPTS), generator=generators, num_inference_steps=2, output_type="latent", **call)
    return (out.frames if hasattr(out, "frames") else out.images).float()


@rank_checks("pipeline cfg parallel", world_size=2)
def _world2(rank, world_size):
    from opendit_lite.encoders.pipeline_folder import TRANSFORMERS
    from opendit_lite.families.registry import conditioning_of_pipeline
    from opendit_lite.families.tiny_pipelines import build_tiny_pipeline
    from opendit_lite.sampling.pipeline_cfg_parallel import PipelineBranches, split_branches

    warnings.filterwarnings("ignore")
    out = {}
    for name, call in CASES.items():
        pipe = build_tiny_pipeline(name)
        pipe.set_progress_bar_config(disable=True)
        reference = _latents(pipe, **call)
        mode = conditioning_of_pipeline(type(pipe).__name__).cfg_branches
        branches = PipelineBranches(mode, dist.group.WORLD, rank)
        rows = []  # the rows of each transformer call this rank computes

        def count(module, args, kwargs):
            rows.append(len(args[0] if args else kwargs["hidden_states"]))

        hook = pipe.transformer.register_forward_pre_hook(count, with_kwargs=True)
        with split_branches(pipe, TRANSFORMERS, branches, len(PROMPTS)):
            split = _latents(pipe, **call)
        hook.remove()
        out[name] = {"mode": mode, "diff": (split - reference).abs().max().item(), "rows": rows}
        if name == "qwenimage":
            out[name]["guided"] = (reference - _latents(pipe, **{**call, **UNGUIDED})).abs().max().item()
    return out


def test_each_rank_runs_one_guidance_branch_of_the_pipeline_and_the_samples_are_the_direct_call_s():
    per_rank = spawn_results("pipeline cfg parallel", 2)
    print(per_rank)
    for rank, results in enumerate(per_rank):
        for name, r in results.items():
            assert r["diff"] <= TOL, f"rank {rank}, {name}: {r}"
        assert results["qwenimage"]["guided"] > 1e-4, f"true CFG does not change the samples: {results}"
    assert {n: r["mode"] for n, r in per_rank[0].items()} == MODES
    # batched: each rank runs its 2 of the 4 rows at both steps; two calls: both ranks run the first step's
    # two calls (a new shape), then rank 0 the prompts' call and rank 1 the negative prompts'
    for name, mode in MODES.items():
        if mode == "batched":
            assert per_rank[0][name]["rows"] == per_rank[1][name]["rows"] == [2, 2], (name, per_rank)
        else:
            assert per_rank[0][name]["rows"] == [2, 2] and per_rank[1][name]["rows"] == [2, 2, 2], (name, per_rank)


def _refusal(folder, scale) -> str:
    from opendit_lite.builders.pipeline import pipeline_folder
    from opendit_lite.errors import ConfigError
    from opendit_lite.sampling.pipeline_sampling import check_pipeline_cfg_parallel

    with pytest.raises(ConfigError) as e:
        check_pipeline_cfg_parallel(pipeline_folder(folder), scale)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_pipeline_without_two_branches_to_split_is_refused(tiny_pipeline):
    from opendit_lite.builders.pipeline import pipeline_folder
    from opendit_lite.families.wan.conditioning import WanConditioning
    from opendit_lite.sampling.pipeline_sampling import check_pipeline_cfg_parallel

    check_pipeline_cfg_parallel(pipeline_folder(tiny_pipeline("z_image")), 3.0)
    message = _refusal(tiny_pipeline("flux2"), 4.0)
    assert "embeds the guidance scale as an input" in message and "sample.cfg_parallel=false" in message, message
    with mock.patch.object(WanConditioning, "cfg_branches", None):  # a family that does not declare its branches
        message = _refusal(tiny_pipeline("wan"), 5.0)
    assert "does not declare how it runs guidance's two branches (its conditioning's cfg_branches)" in message
    message = _refusal(tiny_pipeline("z_image"), None)
    assert "give the scale they are combined at, sample.cfg_scale" in message, message
    message = _refusal(tiny_pipeline("z_image"), 0.0)
    assert "runs no unconditional branch at that scale" in message and "above 0" in message, message
    message = _refusal(tiny_pipeline("qwenimage"), 1.0)
    assert "runs no unconditional branch at that scale" in message and "above 1" in message, message


def test_a_turbo_folder_is_refused(tiny_pipeline, tmp_path):
    folder = tmp_path / "Z-Image-Turbo"
    folder.symlink_to(tiny_pipeline("z_image_turbo"))
    message = _refusal(str(folder), 3.0)
    assert "Z-Image-Turbo is distilled from classifier-free guidance" in message, message


def test_qwen_image_samples_by_true_cfg_with_its_negative_prompt():
    """sample.cfg_scale reaches QwenImagePipeline as ``true_cfg_scale`` (its ``guidance_scale`` is the guidance
    embedding's, which the model lacks), with the empty negative prompt that turns true CFG on."""
    from opendit_lite.families.qwen_image.conditioning import CONDITIONING

    assert CONDITIONING.guidance_call(4.0, guided=False) == {"true_cfg_scale": 4.0, "negative_prompt": ""}
    assert CONDITIONING.guidance_call(1.0, guided=False) == {"true_cfg_scale": 1.0}
    assert CONDITIONING.guidance_call(4.0, guided=True) == {"guidance_scale": 4.0}


def test_calls_that_do_not_follow_the_declared_pattern_are_refused():
    """Before any exchange: a batched call of neither B nor 2B rows, a second call on other latents (a
    pipeline that ran no unconditional branch) and a step left with one call."""
    from opendit_lite.errors import ConfigError
    from opendit_lite.sampling.pipeline_cfg_parallel import PipelineBranches

    def model(hidden_states):
        return (hidden_states * 2,)

    batched = PipelineBranches("batched", None, 0)
    batched.rows = 2
    assert torch.equal(batched(model, (torch.ones(2, 3),), {})[0], torch.full((2, 3), 2.0))  # unguided: whole
    with pytest.raises(ConfigError, match="called on 3 rows for 2 prompts"):
        batched(model, (torch.ones(3, 3),), {})
    pairs = PipelineBranches("two_calls", None, 0)
    pairs(model, (), {"hidden_states": torch.zeros(2, 3)})
    with pytest.raises(ConfigError, match="was not called twice on the same latents"):
        pairs(model, (), {"hidden_states": torch.ones(2, 3)})
    pairs(model, (), {"hidden_states": torch.zeros(2, 3)})
    with pytest.raises(ConfigError, match="last step called its transformer once"):
        pairs.finish()
