"""Distilling a released pipeline (train_video.py with ``model.pipeline`` and ``distill.teacher`` naming it):
a tiny Wan pipeline's transformer distilled to a 2-step LoRA student on latents extracted from it, run
straight and resumed half-way (both adapters and the optimizer bit-identical), its exported LoRA loaded
by ``WanPipeline.load_lora_weights`` with no key warning, and the pipeline called at the student's step
count without guidance reproducing the student's own rollout from the same noise (the scheduler's
moves, Wan's UniPC, included), as sample_video.py does; a full-weight student's exported pipeline folder
likewise; the refusals end with exit 2 and one paragraph. Also: checkpointed blocks recompute with the
trained network's adapter, and the student's rollout is its pipeline's call for every family that declares
how its pipeline sets its scheduler (Flux, SD3, HunyuanVideo, HunyuanVideo 1.5, LTX-Video, Qwen-Image,
Z-Image, FLUX.2); the exported call follows each pipeline's guidance keywords, and a guidance-distilled
teacher without a guidance input (Z-Image-Turbo) is refused a guided real score."""

import os
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from opendit_lite.diffusion.scheduler_rollout import SchedulerRollout, flow_scheduler_error
from tests.pipeline_runs import extracted_latents, write_clip, write_csv
from tests.video_scripts.test_family_scripts import exits_2, main
from tests.video_scripts.test_lora_export import LoadLog
from tests.video_scripts.test_pipeline_sampling import direct, sampled

PROMPT = "a red square moving right"
STEPS = 2


def _args(pipeline: str, data: str, results) -> list:
    return [f"model.pipeline={pipeline}", f"distill.teacher={pipeline}", "data.type=latents", f"data.path={data}",
            "precision=fp32", "global_batch_size=2", "lr=1e-2", "log_every=1", "lora.rank=4", "lora.alpha=4",
            f"distill.student_timesteps={STEPS}", "distill.critic_updates=1", "distill.guidance_scale=3",
            f"results_dir={results}", "logger=[]"]


def _student_sample(pipe, lora_state, noise, rank: int = 4):
    """The student's own sample: the pipeline's transformer with the student's weights (``rank`` > 0: its
    adapter on the base), rolled out by a copy of the pipeline's scheduler (``SchedulerRollout``) on the
    prompt's text inputs."""
    import copy

    from opendit_lite.families import family_of_pipeline
    from opendit_lite.families.pipeline_denoiser import PipelineDenoiser
    from opendit_lite.models.lora import apply_lora

    family = family_of_pipeline("WanPipeline")
    c = family.conditioning_of("WanPipeline")
    model = copy.deepcopy(pipe.transformer)
    if rank:
        apply_lora(model, rank=rank, alpha=rank, dropout=0.0, targets=None)
    missing, unexpected = model.load_state_dict(lora_state, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    text = c.encode_text(pipe, [PROMPT])
    denoiser = PipelineDenoiser(c, family.adapter, model, model.config, c.constants(pipe, model.config, None), text)
    with torch.no_grad():
        return SchedulerRollout(pipe.scheduler, STEPS).rollout(lambda x, t: denoiser(x, t, **text), noise, STEPS)


def test_wan_lora_distillation_resumes_exports_and_the_pipeline_samples_the_student(tiny_pipeline, tmp_path, capsys):
    from diffusers import WanPipeline, WanTransformer3DModel

    from opendit_lite.builders.student_lora import student_lora_state

    pipeline = tiny_pipeline("wan")
    data = extracted_latents(pipeline, tmp_path, [PROMPT, "a blue disc moving up"])
    args = _args(pipeline, data, tmp_path)
    main("train_video", [*args, "exp_name=straight", "max_steps=4", "ckpt_every=2"])
    checkpoints = f"{tmp_path}/straight/checkpoints"
    # resumed from the straight run's step 2 in a run of its own
    main("train_video", [*args, "exp_name=resumed", "max_steps=4", "ckpt_every=2", "export.diffusers=false",
                         f"resume_from={checkpoints}/straight_step2"])
    log = "".join(capsys.readouterr())
    straight, resumed = f"{checkpoints}/straight_step4", f"{tmp_path}/resumed/checkpoints/resumed_step4"
    parts = sorted(os.path.relpath(os.path.join(d, f), straight) for d, _, files in os.walk(straight) for f in files
                   if f.endswith((".safetensors", ".bin", ".pt", ".pth")))
    assert any("optim" in p for p in parts), parts
    for part in parts:  # the model (base and both adapters), the EMA, the optimizer's states
        if part.endswith(".safetensors"):
            a, b = load_file(os.path.join(straight, part)), load_file(os.path.join(resumed, part))
        else:
            a, b = (_tensors(torch.load(os.path.join(r, part), map_location="cpu", weights_only=False))
                    for r in (straight, resumed))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part
    model = load_file(os.path.join(straight, "model", "model-00001.safetensors"))
    for role in ("student", "critic"):  # both adapters trained
        assert any(f".lora_B.{role}." in k and v.abs().max() > 0 for k, v in model.items()), role

    out = f"{tmp_path}/straight/diffusers"
    call_words = f"num_inference_steps={STEPS}, guidance_scale=1.0"
    note = open(os.path.join(out, "sampling.txt")).read()
    assert call_words in note and f"load_lora_weights({out!r})" in note and call_words in log
    pipe = WanPipeline.from_pretrained(pipeline)
    noise = torch.randn(1, 16, 1, 4, 4, generator=torch.Generator().manual_seed(3))
    call = dict(height=16, width=16, num_frames=1, num_inference_steps=STEPS, guidance_scale=1.0, output_type="latent")
    with torch.no_grad():
        base = pipe(PROMPT, latents=noise.clone(), **call).frames
    own = _student_sample(pipe, student_lora_state(straight, 4, use_ema=True), noise.clone())
    with LoadLog() as load_log:
        pipe.load_lora_weights(out)
    assert not load_log.key_warnings(), load_log.text()
    with torch.no_grad():
        loaded = pipe(PROMPT, latents=noise.clone(), **call).frames
    err = (loaded - own).abs().max().item()
    measured = [f"pipeline with the exported LoRA vs the student's own rollout: max |diff| {err:.2e}"]
    assert err <= 1e-5 * max(1.0, own.abs().max().item()), err
    assert (base - loaded).abs().max() > 1e-3, "the student's adapter changes nothing to compare"
    # sample_video.py samples the student through the pipeline: the direct call with the exported LoRA
    sample = [*args, "exp_name=straight", f"sample.prompts={[PROMPT]}", f"sample.num_sampling_steps={STEPS}",
              "data.num_frames=1", "data.image_size=16"]
    ours, theirs = sampled(sample), direct(pipe, [PROMPT], num_inference_steps=STEPS, guidance_scale=1.0, height=16,
                                           width=16, num_frames=1)
    measured.append(f"sample_video.py vs the direct call with the LoRA: max |diff| {(ours - theirs).abs().max():.2e}")
    assert (ours - theirs).abs().max() <= 1e-5, (ours - theirs).abs().max()


    # lora.rank=0: three transformers; the run's end writes the student's pipeline folder (the rest linked)
    main("train_video", [*args, "lora.rank=0", "exp_name=full", "max_steps=2"])
    full = f"{tmp_path}/full/checkpoints/full_step2"
    weights = load_file(os.path.join(full, "model", "model-00001.safetensors"))
    released = WanTransformer3DModel.from_pretrained(os.path.join(pipeline, "transformer")).state_dict()
    assert all(torch.equal(weights[f"teacher.{k}"], v) for k, v in released.items())  # frozen
    assert any(not torch.equal(weights[f"student.{k}"], v) for k, v in released.items())  # trained
    full_out = f"{tmp_path}/full/diffusers"
    assert f"from_pretrained({full_out!r})" in open(os.path.join(full_out, "sampling.txt")).read()
    full_pipe = WanPipeline.from_pretrained(full_out)
    with torch.no_grad():
        loaded = full_pipe(PROMPT, latents=noise.clone(), **call).frames
    own = _student_sample(full_pipe, student_lora_state(full, 0, use_ema=True), noise.clone(), rank=0)
    measured.append(f"full-weight student's pipeline folder vs its own rollout: max |diff| "
                    f"{(loaded - own).abs().max():.2e}")
    assert (loaded - own).abs().max() <= 1e-5 * max(1.0, own.abs().max().item())

    capsys.readouterr()
    for extra, words in ((f"sample.num_sampling_steps={STEPS + 1}", f"distilled to {STEPS} steps"),
                         ("sample.cfg_scale=5", "without classifier-free guidance")):
        assert words in exits_2(capsys, "sample_video", [*sample, extra])
    ti2v = tiny_pipeline("wan_ti2v")  # a WanPipeline folder (TI2V-5B as released)
    clips = write_csv(tmp_path, [(write_clip(tmp_path / "clip.mp4", 5, 16, 16), PROMPT)])
    refusals = {  # the overrides -> words of the one-paragraph message
        (f"distill.teacher={tmp_path}",): "another model than this run",
        ("distill.student_timesteps=400",): "timesteps for 400 steps differ",
        (f"lora.init_from={out}",): "clash",
        ("zero_degree=3", "lora.rank=0"): "zero_degree=3 (Gemini)",
        # TI2V-5B's WanPipeline folder loaded as its image-to-video (model.pipeline_class): image-conditioned
        (f"model.pipeline={ti2v}", f"distill.teacher={ti2v}", "model.pipeline_class=WanImageToVideoPipeline",
         "data.type=csv", f"data.path={clips}", "data.num_frames=5", "data.image_size=16"):
            "WanImageToVideoPipeline is conditioned on images",
    }
    capsys.readouterr()  # the pipeline's loading bars
    for overrides, words in refusals.items():
        err_text = exits_2(capsys, "train_video", [*args, "exp_name=refused", "max_steps=1", *overrides])
        assert words in err_text, (overrides, err_text)
    print("\n".join(measured))  # shown by pytest -rP


def _tensors(obj, prefix=""):
    """Every tensor of a nested optimizer state, by its path."""
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_tensors(v, f"{prefix}.{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_tensors(v, f"{prefix}.{i}"))
    return out


def test_the_student_grid_and_the_schedulers_refused():
    """A scheduler that is not flow matching is refused; a grid with repeated timesteps is named."""
    from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    assert "not a flow-matching scheduler" in flow_scheduler_error(DDIMScheduler())
    unipc = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    assert flow_scheduler_error(unipc) is None and flow_scheduler_error(FlowMatchEulerDiscreteScheduler()) is None
    rollout = SchedulerRollout(FlowMatchEulerDiscreteScheduler(shift=3.0), 4)
    assert rollout.problem() is None and len(rollout.times()) == 5 and rollout.times()[-1] == 0.0
    # Euler on a constant velocity: x_N = noise - v (the noise levels run from 1 to 0)
    noise, v = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(rollout.rollout(lambda x, t: v, noise, 4), noise - v, rtol=0, atol=1e-6)
    tied = SchedulerRollout(FlowMatchEulerDiscreteScheduler(), 3, sigmas=[1.0, 0.5, 0.5])
    assert "repeat" in tied.problem()


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_checkpointed_blocks_recompute_with_the_trained_networks_adapter(tiny_pipeline):
    """All blocks checkpointed: each step's adapter gradients equal those without checkpointing (a block's
    forward is recomputed in the backward pass, after the call switched its adapter back), on a critic
    step and on a student step."""
    import copy
    from types import SimpleNamespace

    from diffusers import WanTransformer3DModel

    from opendit_lite.builders.distill_model import CRITIC, ROLES, STUDENT, add_adapters
    from opendit_lite.diffusion.sampling_utils import SampleGenerators
    from opendit_lite.families import family_of_pipeline
    from opendit_lite.families.pipeline_denoiser import PipelineDenoiser
    from opendit_lite.parallelization import parallelize
    from opendit_lite.training.distill_pipeline import (
        DistillDenoisers,
        PipelineDistillModule,
        RoleCall,
        pipeline_distill_loss,
    )

    folder = tiny_pipeline("wan")
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler.from_pretrained(folder, subfolder="scheduler")
    base = WanTransformer3DModel.from_pretrained(os.path.join(folder, "transformer"))
    add_adapters(base, (STUDENT, CRITIC), rank=2, alpha=2.0, dropout=0.0, targets=None)
    torch.manual_seed(0)
    with torch.no_grad():  # the two adapters differ from each other and from the base
        for name, p in base.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.05)
    family = family_of_pipeline("WanPipeline")
    c = family.conditioning_of("WanPipeline")
    text = {"encoder_hidden_states": torch.randn(1, 8, 32)}  # 8 caption tokens: the test is about the blocks
    null = {"encoder_hidden_states": torch.zeros(1, 8, 32)}
    cfg = SimpleNamespace(distill=SimpleNamespace(student_timesteps=STEPS, guidance_scale=3.0, critic_updates=1),
                          global_seed=0)

    def grads(module, step):
        module.train()
        denoisers = DistillDenoisers(
            {r: PipelineDenoiser(c, family.adapter, RoleCall(module, r), base.config, {"expand_timesteps": False},
                                 null) for r in ROLES}, lambda shape: SchedulerRollout(scheduler, STEPS), module)
        x = torch.zeros(1, 16, 1, 4, 4)
        loss = pipeline_distill_loss(denoisers, SimpleNamespace(num_timesteps=1000), cfg, x, dict(text),
                                     SampleGenerators(0, [0], stream=(step,)), step)
        loss.backward()
        out = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
        module.zero_grad(set_to_none=True)
        return out

    plain = PipelineDistillModule(base)
    checkpointed = PipelineDistillModule(copy.deepcopy(base))
    report = parallelize(checkpointed, sp_group=None, sp_mode="ulysses", selective_ratio=0.0, ac_offload=False,
                         lora_rank=0)
    assert "checkpointed" in str(report)
    for step, role in ((0, CRITIC), (1, STUDENT)):
        expected, got = grads(plain, step), grads(checkpointed, step)
        assert expected and all(f".{role}." in n for n in expected), sorted(expected)[:3]
        assert expected.keys() == got.keys()
        for n in expected:
            torch.testing.assert_close(got[n], expected[n], rtol=1e-5, atol=1e-7, msg=n)


# tiny pipeline -> its pipeline class: every family that declares ``set_timesteps_kwargs`` (Wan: above)
ROLLED_OUT = {"flux": "FluxPipeline", "sd3": "StableDiffusion3Pipeline", "hunyuanvideo": "HunyuanVideoPipeline",
              "ltx": "LTXPipeline", "qwenimage": "QwenImagePipeline", "z_image": "ZImagePipeline",
              "flux2": "Flux2Pipeline", "hunyuanvideo15": "HunyuanVideo15Pipeline"}
ROLLED_STEPS = 3  # two steps would not test the shift: a terminal-stretched grid of 2 is (1, shift_terminal)


# a released scheduler setting the tiny pipelines lack, put in the pipeline's scheduler: (tiny pipeline, config)
SCHEDULER_VARIANTS = {"sd3-dynamic-shift": ("sd3", dict(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.16))}


def test_every_declared_text_pipeline_has_its_rollout_checked():
    """Each pipeline a distillation takes (text-conditioned, its family declaring ``set_timesteps_kwargs``) is
    one of the rollout cases below, or Wan's, whose end-to-end run above checks it."""
    from opendit_lite.families.conditioning_base import PipelineConditioning
    from opendit_lite.families.registry import FAMILIES

    declared = {v.pipeline for f in FAMILIES.values() for v in f.pipelines if v.conditioning.image_input == "none"
                and type(v.conditioning).set_timesteps_kwargs is not PipelineConditioning.set_timesteps_kwargs}
    assert declared == {*ROLLED_OUT.values(), "WanPipeline"}, declared ^ {*ROLLED_OUT.values(), "WanPipeline"}


@pytest.mark.parametrize("case", [*sorted(ROLLED_OUT), *SCHEDULER_VARIANTS])
def test_a_student_rolled_out_by_the_scheduler_is_the_pipeline_call(tiny_pipeline, case):
    """Each family's pipeline (the guidance embeddings of FLUX.1-dev, FLUX.2 and HunyuanVideo, the pipelines'
    own sigmas, the dynamic shift of the token count, FLUX.2's empirical mu, LTX-Video's and Qwen-Image's
    terminal-stretched grid, Z-Image's 1 - sigma time, HunyuanVideo 1.5's guider): the student's
    rollout (``set_timesteps_kwargs``) from the same noise gives the pipeline's latents at the student's step
    count and its guidance off (the guidance-embedded models: their default embedded guidance)."""
    import inspect

    from diffusers import DiffusionPipeline

    from opendit_lite.builders.student_lora import student_guidance
    from opendit_lite.families import family_of_pipeline
    from opendit_lite.families.pipeline_denoiser import PipelineDenoiser
    from opendit_lite.families.tiny_pipelines import TINY_CALLS
    from tests.families.pipeline_capture import model_latents, pipeline_latents

    name, scheduler = SCHEDULER_VARIANTS.get(case, (case, None))
    folder, cls = tiny_pipeline(name), ROLLED_OUT[name]
    pipe = DiffusionPipeline.from_pretrained(folder)
    if scheduler:
        pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config, **scheduler)
    assert type(pipe).__name__ == cls
    family, call = family_of_pipeline(cls), dict(TINY_CALLS[name], num_inference_steps=ROLLED_STEPS)
    c, config = family.conditioning_of(cls), pipe.transformer.config
    T = c.latent_frames(pipe, call.get("num_frames", 1))
    h, w = call["height"] // c.pixel_ratio(pipe), call["width"] // c.pixel_ratio(pipe)
    folder_config = SimpleNamespace(model=SimpleNamespace(pipeline=folder, guidance=None))
    guidance = c.guidance_call(student_guidance(folder_config), c.guided(config))
    if "guidance_scale" in guidance and "guidance_scale" not in inspect.signature(type(pipe).__call__).parameters:
        pipe.guider = pipe.guider.new(guidance_scale=guidance.pop("guidance_scale"))  # HunyuanVideo 1.5's guider
    call.update(guidance)
    shape = (1, family.adapter.latent_channels(config), T, h, w)
    noise = torch.randn(*shape, generator=torch.Generator().manual_seed(5))                   # [1, C, T, h, w]
    moved = []
    step = pipe.scheduler.step

    def recording(*args, **kwargs):
        out = step(*args, **kwargs)
        moved.append(out[0] if isinstance(out, tuple) else out.prev_sample)
        return out

    pipe.scheduler.step = recording
    with torch.no_grad():
        pipe(prompt=PROMPT, latents=pipeline_latents(pipe, noise), output_type="latent", **call)
        del pipe.scheduler.step
        expected = model_latents(pipe, moved[-1], shape)
        text = c.encode_text(pipe, [PROMPT])
        denoiser = PipelineDenoiser(c, family.adapter, pipe.transformer, config, c.constants(pipe, config, None), text)
        kwargs = c.set_timesteps_kwargs(pipe, ROLLED_STEPS, tuple(noise.shape), config)
        rollout = SchedulerRollout(pipe.scheduler, ROLLED_STEPS, **kwargs)
        own = rollout.rollout(lambda x, t: denoiser(x, t, **text), noise, ROLLED_STEPS)             # [1, C, T, h, w]
    assert len(moved) == ROLLED_STEPS
    diff = (own - expected).abs().max().item()
    print(f"{case}: the student's rollout vs the pipeline call: max |diff| {diff:.2e}")
    assert diff <= 1e-5 * max(1.0, expected.abs().max().item()), diff


def test_the_student_call_follows_each_pipelines_guidance_and_a_guidance_distilled_teacher_is_refused(
        tiny_pipeline, tmp_path):
    """The exported student's call (``sampling.txt``) gives each pipeline its guidance off as it takes it:
    HunyuanVideo 1.5 on a copy of its guider (its ``__call__`` takes no ``guidance_scale``), Qwen-Image as
    ``true_cfg_scale``. Z-Image-Turbo (distilled from classifier-free guidance, no guidance input) has no
    unconditional branch for the teacher's guided real score: refused unless distill.guidance_scale is 1."""
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.errors import ConfigError
    from opendit_lite.training.distill_pipeline import sampling_call, validate_pipeline_distill

    def config(name, *extra):
        folder = tiny_pipeline(name)
        return load_config(None, [f"model.pipeline={folder}", f"distill.teacher={folder}", "data.type=latents",
                                  f"data.path={tmp_path}", "lora.rank=4", "distill.student_timesteps=4", *extra],
                           schema=VideoTrainConfig)

    call = sampling_call(config("hunyuanvideo15"), "out")
    assert "; pipe.guider = pipe.guider.new(guidance_scale=1.0); pipe(prompt, num_inference_steps=4)  #" in call, call
    assert "pipe(prompt, num_inference_steps=4, true_cfg_scale=1.0)  #" in sampling_call(config("qwenimage"), "o")
    assert "pipe(prompt, num_inference_steps=4, guidance_scale=0.0)  #" in sampling_call(config("z_image_turbo"), "o")
    with pytest.raises(ConfigError) as refused:
        validate_pipeline_distill(config("z_image_turbo", "distill.guidance_scale=4"), lambda cfg: None)
    assert "Z-Image-Turbo is distilled from classifier-free guidance" in str(refused.value)
    assert "set distill.guidance_scale=1" in str(refused.value)
    validate_pipeline_distill(config("z_image_turbo", "distill.guidance_scale=1"), lambda cfg: None)
    validate_pipeline_distill(config("z_image", "distill.guidance_scale=4"), lambda cfg: None)  # the base model
