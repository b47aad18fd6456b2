"""train_video.py's (and, for the image pipelines, train.py's) few-step distillation of a released pipeline
(``model.pipeline`` with ``distill.teacher`` naming the same folder; DMD2, Yin et al. 2024): a LoRA (or
full-weight) student that the pipeline itself samples in ``distill.student_timesteps`` steps without
classifier-free guidance.

The networks (``PipelineDistillModule``): the pipeline's transformer is the frozen base and the teacher
(no adapter); student and critic are two peft adapters on the same layers (``builders/distill_model.py``'s
LoRA layout, its keys ``base.*`` with adapters ``student`` and ``critic``). Memory is one model plus two
adapters and their optimizer states. The run's one optimizer and the step rule are the zoo's
(``training/distill.py``): ``distill.critic_updates`` critic steps, then one student step, and again.

Every call is conditioned as fine-tuning conditions it (``PipelineDenoiser``: the family's inputs from the
CSV's captions, or the extracted latents' text); the teacher's real score is guided with
``distill.guidance_scale`` against the pipeline's unconditional branch (the encoded negative prompt the
caption dropout uses); a guidance-distilled transformer (FLUX.1-dev) has none, and its teacher is called
once with its guidance embedding at ``distill.guidance_scale``, while student and critic get the value the
pipeline samples with (``model.guidance``, else its default ``guidance_scale``). No caption is dropped
from the student's or the critic's calls.

The student is sampled by the pipeline's own scheduler (``diffusion/scheduler_rollout.py``): its input at
step k is the scheduler stepping the student's predictions from noise, set up as the pipeline's
``__call__`` sets it up (``conditioning.set_timesteps_kwargs``: the release's shift, a dynamic shift for
the resolution), so that ``pipe(..., num_inference_steps=N, guidance_scale=<the family's off value>)``
with the exported LoRA runs the student at exactly its training times and moves (tested: the same
latents as the student's own rollout). The export (``export_student``) is the student's adapter as the
fine-tune LoRA export writes it, ``<run dir>/diffusers/``, with the exact call printed and written to
``<run dir>/diffusers/sampling.txt``.

With ``lora.rank`` 0 the student is a full-weight copy (three transformers: teacher frozen, student and
critic trained), exported as a pipeline folder (its transformer written, the rest linked).

Parallelism and memory as in fine-tuning, with the zoo distillation's mechanisms: DDP (unused parameters
found) and ZeRO-1/2 (LowLevelZero steps only the parameters whose gradient arrived, and saves the
not-yet-stepped ones with an empty state: ``plugins/zero.py``), the run's sharded EMA of the student only
(``ema_averages``), sequence parallelism of each transformer as the family's spec makes it
(``sequence_parallel_networks``), block swapping of the LoRA base's blocks (``get_fsdp_wrap_module_list``).

Not supported yet (refused before anything starts): two experts (Wan 2.2 A14B),
image-conditioned pipelines, schedulers that are not flow matching (CogVideoX's), families that do not
declare how their pipeline sets its scheduler (Wan, Flux, SD3, HunyuanVideo, HunyuanVideo 1.5, LTX-Video,
Qwen-Image, Z-Image and FLUX.2 do), a teacher distilled from classifier-free guidance without a guidance
input (Z-Image-Turbo) at a ``distill.guidance_scale`` other than 1, ZeRO-3 (Gemini), block swapping of a
full-weight student, and the options the validation lists.
"""

import copy
import dataclasses
import os
from typing import Dict, Tuple

import torch
import torch.nn as nn

from ..builders.distill_model import (
    CRITIC,
    ROLES,
    STUDENT,
    TEACHER,
    DistillNetworks,
    add_adapters,
    check_resumed_distillation,
)
from ..builders.pipeline import light_pipeline, run_pipeline_folder
from ..builders.student_lora import student_guidance, write_student_adapter, write_student_pipeline
from ..builders.video import build_video_model
from ..checkpoint.files import atomic_path
from ..config import to_dict
from ..diffusion.distribution_matching import critic_loss, generator_loss
from ..diffusion.sampling_utils import standard_normal_like
from ..diffusion.scheduler_rollout import SchedulerRollout, flow_scheduler_error
from ..distributed.ranks import from_rank0, global_rank
from ..errors import CheckpointError, ConfigError
from ..families.conditioning_base import PipelineConditioning
from ..interop.diffusers_export import pipeline_loads_lora
from ..interop.pretrained_files import LORA_WEIGHT_NAME
from .distill import JUDGE_HIGH, JUDGE_LOW, distill_loss_kinds, is_student_step, student_step_index
from .pipeline_data import prepare_pipeline_data
from .spec import TrainerSpec

SAMPLING_NOTE = "sampling.txt"  # beside the exported LoRA: the exact pipeline call


class PipelineDistillModule(DistillNetworks):
    """Teacher, student and critic of a pipeline's distillation (``DistillNetworks``: LoRA, the pipeline's
    transformer ``base`` with the adapters ``student`` and ``critic``; full weights, three transformers);
    ``forward(role, **inputs)`` runs ``role``'s network on the keyword inputs its pipeline gives the
    transformer."""

    @property
    def transformer(self) -> nn.Module:
        """The pipeline's transformer as loaded (its config, its device): the base, or the teacher."""
        return self.base if self.lora else self.teacher

    def sequence_parallel_networks(self) -> Tuple[Tuple[str, nn.Module], ...]:
        """What sequence parallelism converts (``parallelization.apply_sequence_parallel``): each
        transformer as if it were the model (a diffusers family's spec places its hooks by path from the
        transformer's root)."""
        return self.networks()

    def forward(self, role: str, **inputs):
        return self.run_role(role, **inputs)


class RoleCall:
    """``call`` (the boosted ``PipelineDistillModule``) as one role's transformer: ``(**inputs) -> output``."""

    def __init__(self, call, role: str):
        self.call, self.role = call, role

    def __call__(self, **inputs):
        return self.call(role=self.role, **inputs)


class DistillDenoisers:
    """Each role's ``PipelineDenoiser`` (``denoisers[role](x, t, drop=None, **text)``) and the student's
    scheduler rollout for a latent shape. No caption dropout (``condition_dropout_kwarg`` None): the
    student learns every caption's guided samples; only the teacher's unconditional branch sees the null
    text."""

    condition_dropout_kwarg = None
    is_video = True

    def __init__(self, by_role: Dict[str, object], rollout_for, module: PipelineDistillModule,
                 embedded_guidance: bool = False):
        self.by_role, self.rollout_for, self.module = by_role, rollout_for, module
        self.embedded_guidance = embedded_guidance  # the teacher guides through its guidance embedding

    def __getitem__(self, role: str):
        return self.by_role[role]


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------

def _same_folder(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def validate_pipeline_distill(cfg, validate_video) -> None:
    """What the distillation of a pipeline does not take, refused before anything is built
    (``validate_video``: the video trainer's own checks, which resolve the pipeline first)."""
    validate_video(cfg)
    d, m = cfg.distill, cfg.model
    if not _same_folder(d.teacher, m.pipeline):
        raise ConfigError(f"'distill.teacher' {d.teacher!r} is another model than this run's 'model.pipeline' "
                          f"{m.pipeline!r}: a pipeline is distilled from its own transformer (the frozen base that "
                          f"student and critic adapt); set distill.teacher to the model.pipeline folder.")
    folder = run_pipeline_folder(cfg)  # as model.pipeline_class loads it: its conditioning is the run's
    c, name = folder.conditioning, folder.pipeline_class
    if cfg.lora.init_from:
        raise ConfigError(f"lora.init_from={cfg.lora.init_from!r} in a distillation: the adapters of this run are "
                          f"'{STUDENT}' and '{CRITIC}', which start as no-ops on the teacher; a file's adapter would "
                          f"clash with them. To distill a fine-tuned model, merge its LoRA into the pipeline "
                          f"(export.lora=merged) and distill that folder; remove lora.init_from.")
    if len(folder.experts) > 1:
        raise ConfigError(f"{m.pipeline!r} holds two experts ({', '.join(folder.experts)}); distilling a pipeline "
                          f"of two transformers is not supported yet: distill a one-transformer pipeline.")
    if c.image_input != "none":
        raise ConfigError(f"{name} is conditioned on images; distilling image-conditioned pipelines is not "
                          f"supported yet: distill a text-conditioned pipeline.")
    pipe = light_pipeline(folder.path, name)
    why = flow_scheduler_error(pipe.scheduler)
    if why:
        raise ConfigError(f"{name}'s scheduler {why}: the distilled student is a flow-matching few-step sampler, "
                          f"run by the pipeline's own scheduler; distill a flow-matching pipeline (Wan, Flux, SD3, "
                          f"...).")
    if type(c).set_timesteps_kwargs is PipelineConditioning.set_timesteps_kwargs:
        raise ConfigError(f"the {folder.family.name} family does not declare how {name} sets its scheduler's "
                          f"timesteps (conditioning.set_timesteps_kwargs), so the student's times could not be the "
                          f"pipeline's: distilling it is not supported yet.")
    why = c.guidance_free(folder.path, m.guidance_distilled)
    if why and not c.guided(folder.transformer_config()) and d.guidance_scale != 1:
        raise ConfigError(f"{why}. Its teacher has no unconditional branch to guide with, so a real score guided at "
                          f"distill.guidance_scale={d.guidance_scale:g} against that branch is not the model's "
                          f"distribution (and a guidance input for another route it lacks): set "
                          f"distill.guidance_scale=1 (the teacher's conditional prediction, as it samples).")
    if cfg.diffusion.objective not in (None, "rflow"):
        raise ConfigError(f"diffusion.objective={cfg.diffusion.objective!r}: a pipeline's student is distilled "
                          f"with flow matching (rflow), as its scheduler samples it; remove diffusion.objective.")
    if cfg.zero_degree == 3:
        raise ConfigError("zero_degree=3 (Gemini) in a pipeline's distillation: each step trains the student or the "
                          "critic and leaves the other without a gradient, which GeminiDDP refuses at the end of each "
                          "backward (its chunks are reduced once every parameter's gradient arrived), and its EMA "
                          "cannot average the student alone; use zero_degree=1 or 2 (LowLevelZero leaves such "
                          "parameters and their Adam state untouched) or 0.")
    if cfg.memory.blocks_to_swap and not cfg.lora.rank:
        raise ConfigError(f"memory.blocks_to_swap={cfg.memory.blocks_to_swap} with lora.rank=0: block swapping keeps "
                          f"a LoRA base's frozen block weights in host memory, but a full-weight student and critic "
                          f"train all of theirs; set lora.rank > 0 or memory.blocks_to_swap=0.")
    unsupported = {"lora.base_precision": cfg.lora.base_precision != "none", "compile": cfg.compile,
                   "sample.every": cfg.sample.every != 0, "distill.gan_weight": d.gan_weight > 0,
                   "export.lora=merged": cfg.export.lora == "merged"}
    bad = [k for k, on in unsupported.items() if on]
    if bad:
        raise ConfigError(f"distilling a pipeline (distill.teacher with model.pipeline) does not support "
                          f"{', '.join(bad)} yet (one process, DDP or ZeRO-1/2, sequence parallelism, LoRA or "
                          f"full-weight student and critic, block swapping with LoRA, "
                          f"fp32/bf16, the student exported as a LoRA or its own pipeline folder): remove "
                          f"{' and '.join(bad)} from the config.")


def student_rollout(cfg, x_shape: Tuple[int, ...]) -> SchedulerRollout:
    """The pipeline's scheduler set up for the student's steps on latents of ``x_shape``, its grid checked."""
    folder = run_pipeline_folder(cfg)
    pipe = light_pipeline(folder.path, folder.pipeline_class)
    steps = cfg.distill.student_timesteps
    kwargs = folder.conditioning.set_timesteps_kwargs(pipe, steps, tuple(x_shape), folder.transformer_config())
    if kwargs is None:
        raise ConfigError(f"the {folder.family.name} family does not declare how {folder.pipeline_class} sets its "
                          f"scheduler's timesteps for this shape, so the student's times could not be the pipeline's: "
                          f"distilling it is not supported yet.")
    try:
        rollout = SchedulerRollout(pipe.scheduler, steps, **kwargs)
        problem = rollout.problem()
    except (ValueError, IndexError) as e:
        problem = f"set_timesteps fails ({e})"
    if problem:
        raise ConfigError(f"distill.student_timesteps={steps}: {folder.pipeline_class}'s scheduler "
                          f"({type(pipe.scheduler).__name__}) cannot sample {steps} steps: {problem}. Choose a step "
                          f"count it produces (e.g. 4).")
    return rollout


# --------------------------------------------------------------------------------------------------
# The run's pieces
# --------------------------------------------------------------------------------------------------

def build_pipeline_distill_module(cfg) -> PipelineDistillModule:
    """The pipeline's transformer with the ``student`` and ``critic`` adapters (the base frozen), or with
    ``lora.rank`` 0 three copies of it (student and critic trained, the teacher frozen)."""
    check_resumed_distillation(cfg)
    base = build_video_model(cfg)
    if not cfg.lora.rank:
        return PipelineDistillModule(base, copy.deepcopy(base), copy.deepcopy(base))
    clash = sorted(set(getattr(base, "peft_config", {})) & {STUDENT, CRITIC})
    if clash:
        raise ConfigError(f"the transformer of {cfg.model.pipeline!r} already carries adapter(s) named "
                          f"{', '.join(clash)}, the names of the distillation's adapters: save the pipeline with its "
                          f"adapters merged (or removed) and distill that folder.")
    lora = cfg.lora
    add_adapters(base, (STUDENT, CRITIC), rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, targets=lora.targets)
    return PipelineDistillModule(base)


def prepare_distill_data(cfg, device, sp_group=None):
    """The fine-tuning data of the pipeline (its captions' text inputs, the latents' shapes), with the
    role denoisers in place of the one denoiser; the student's step grid checked for the data's shape."""
    data = prepare_pipeline_data(cfg, device, sp_group)
    if cfg.diffusion.objective != "rflow":
        raise ConfigError(f"{cfg.model.pipeline!r} trains with diffusion.objective={cfg.diffusion.objective!r}; a "
                          f"distilled student is a flow-matching sampler: distill a flow-matching pipeline.")
    m = cfg.model
    student_rollout(cfg, (1, m.in_channels, m.num_frames, *m.input_size))  # the step count, before any step
    rollouts: Dict[Tuple[int, ...], SchedulerRollout] = {}

    def rollout_for(x_shape):
        key = tuple(x_shape[1:])
        if key not in rollouts:
            rollouts[key] = student_rollout(cfg, tuple(x_shape))
        return rollouts[key]

    make = data.denoiser  # (transformer, what to call) -> the fine-tuning's PipelineDenoiser
    folder = run_pipeline_folder(cfg)
    config = folder.transformer_config()
    embedded = folder.conditioning.guided(config)

    def denoiser(model, call):
        by_role = {role: make(model.transformer, RoleCall(call, role)) for role in ROLES}
        if embedded:  # the teacher's real score: its guidance embedding at distill.guidance_scale
            pipe = light_pipeline(folder.path, folder.pipeline_class)
            by_role[TEACHER].constants = folder.conditioning.constants(pipe, config, cfg.distill.guidance_scale)
        return DistillDenoisers(by_role, rollout_for, model, embedded_guidance=embedded)

    return dataclasses.replace(data, denoiser=denoiser)


def pipeline_distill_loss(denoisers: DistillDenoisers, objective, cfg, x: torch.Tensor, model_kwargs: dict, draws,
                          step: int) -> torch.Tensor:
    """The loss of optimizer step ``step`` for latents x [B, C, T, h, w] (their shape only) and their text
    inputs ``model_kwargs``: the critic's flow-matching loss on the student's samples, or (a student step)
    the distribution-matching loss between the critic and the guided teacher (``training/distill.py``'s
    step, with the student rolled out by the pipeline's scheduler)."""
    d = cfg.distill
    n, num_timesteps = x.shape[0], objective.num_timesteps
    text = {k: v for k, v in model_kwargs.items() if k != "drop"}
    dropped = torch.ones(n, dtype=torch.bool, device=x.device)                      # [B]: the null text

    def velocity(role):
        denoiser = denoisers[role]
        return lambda z, t: denoiser(z, t, **text)                                   # [B, C, T, h, w]

    def guided_teacher(z, t):  # the pipeline's two branches, as its __call__ runs them
        teacher = denoisers[TEACHER]
        if denoisers.embedded_guidance:  # a guidance-distilled teacher: one call, its embedding at the scale
            return teacher(z, t, **text)
        cond, uncond = teacher(z, t, **text), teacher(z, t, drop=dropped, **text)
        return uncond + d.guidance_scale * (cond - uncond)

    trains_student = is_student_step(step, d.critic_updates)
    denoisers.module.rest(STUDENT if trains_student else CRITIC)  # what a checkpointed block recomputes with
    student = velocity(STUDENT)
    rollout = denoisers.rollout_for(tuple(x.shape))
    k = student_step_index(cfg.global_seed, step, d.student_timesteps)
    noise = standard_normal_like(x, draws)                                           # [B, C, T, h, w]
    x_k = rollout.rollout(student, noise, k)                                         # the student's input at step k
    judge_noise = standard_normal_like(x, draws)
    judge_t = JUDGE_LOW + (JUDGE_HIGH - JUDGE_LOW) * draws.uniform((n,), x.device, torch.float32)  # [B]
    if trains_student:
        x0 = rollout.predict_x0(student, x_k, k)                                     # with gradient
        return generator_loss(x0, guided_teacher, velocity(CRITIC), judge_t, judge_noise, num_timesteps)
    with torch.no_grad():
        x0 = rollout.predict_x0(student, x_k, k)
    return critic_loss(x0, velocity(CRITIC), judge_t, judge_noise, num_timesteps)


# --------------------------------------------------------------------------------------------------
# Out
# --------------------------------------------------------------------------------------------------

def sampling_call(cfg, out: str) -> str:
    """The exact pipeline call that samples the exported student: at the family's keywords for the
    student's guidance (``guidance_call``: Qwen-Image's ``true_cfg_scale``); a pipeline that takes its
    scale on a ``guider`` (HunyuanVideo 1.5's) gets a copy of its guider at that scale first."""
    import inspect

    folder = run_pipeline_folder(cfg)
    steps, c = cfg.distill.student_timesteps, folder.conditioning
    keywords = c.guidance_call(student_guidance(cfg), c.guided(folder.transformer_config()))
    light = light_pipeline(folder.path, folder.pipeline_class)
    guider = ""
    if "guidance_scale" in keywords and "guidance_scale" not in inspect.signature(type(light).__call__).parameters:
        guider = f"pipe.guider = pipe.guider.new(guidance_scale={keywords.pop('guidance_scale')!r}); "
    guidance = "".join(f", {k}={v!r}" for k, v in keywords.items())
    load = (f"pipe.load_lora_weights({out!r})" if pipeline_loads_lora(folder.family.pipeline) else
            f"pipe.transformer.load_lora_adapter({out!r}, weight_name={LORA_WEIGHT_NAME!r})")
    if not cfg.lora.rank:  # the student's own pipeline folder
        return (f"pipe = {folder.pipeline_class}.from_pretrained({out!r}); {guider}"
                f"pipe(prompt, num_inference_steps={steps}{guidance})  # no classifier-free guidance")
    return (f"pipe = {folder.pipeline_class}.from_pretrained({cfg.model.pipeline!r}); {load}; {guider}"
            f"pipe(prompt, num_inference_steps={steps}{guidance})  # the scheduler as saved in the pipeline folder "
            f"({type(light.scheduler).__name__}), no classifier-free guidance")


def write_student_lora(cfg, checkpoint: str, out: str, final: str) -> None:
    """Write the student of ``checkpoint`` to the folder ``out`` (in this process): the LoRA file(s) of the
    fine-tune export (``export.lora_format``), or a full-weight student's pipeline folder (its transformer,
    the other components linked), and ``sampling.txt``, the call that loads it from ``final`` (where
    ``out`` is published)."""
    from .video import export_lora_format

    use_ema = cfg.export.ema and cfg.ema.enable
    if cfg.lora.rank:
        write_student_adapter(to_dict(cfg.model), to_dict(cfg.lora), checkpoint, out, use_ema=use_ema,
                              lora_format=export_lora_format(cfg))
    else:
        write_student_pipeline(to_dict(cfg.model), checkpoint, out, use_ema=use_ema)
    with open(os.path.join(out, SAMPLING_NOTE), "w") as f:
        f.write(sampling_call(cfg, final) + "\n")


def export_student(cfg, checkpoint: str, run_dir: str) -> None:
    """The run's end: the student's adapter to ``<run dir>/diffusers/`` (every rank calls; rank 0 writes),
    and the exact call that samples it."""
    from .video import exports_diffusers

    if not exports_diffusers(cfg):
        return
    out = os.path.join(run_dir, "diffusers")
    with atomic_path(out) as tmp:
        failure = None
        if global_rank() == 0:
            try:
                os.makedirs(tmp, exist_ok=True)
                write_student_lora(cfg, checkpoint, tmp, out)
            except (CheckpointError, ConfigError) as e:
                failure = (type(e), str(e))
        failure = from_rank0(failure)
        if failure is not None:
            raise failure[0](failure[1])
    if global_rank() == 0:
        weights = "EMA" if cfg.export.ema and cfg.ema.enable else "trained"
        what = "student's LoRA" if cfg.lora.rank else "student's pipeline"
        print(f"wrote the {cfg.distill.student_timesteps}-step {what} ({weights} weights) to {out}; sample it with: "
              f"{sampling_call(cfg, out)}")


def pipeline_distill_trainer(video_spec: TrainerSpec) -> TrainerSpec:
    """``video_spec`` (train_video.py's trainer) distilling its ``model.pipeline``: the module of base,
    student and critic, the distillation loss, the student's LoRA export at the end."""

    def describe(cfg):
        d = cfg.distill
        kind = (f"LoRA rank {cfg.lora.rank} adapters {STUDENT}/{CRITIC}" if cfg.lora.rank else
                "full-weight student/critic")
        return (f"{video_spec.describe(cfg)}; distilling {cfg.model.pipeline} to {d.student_timesteps} steps ({kind}, "
                f"teacher guidance {d.guidance_scale:g}, {d.critic_updates} critic updates per student update)")

    def validate(cfg):
        validate_pipeline_distill(cfg, video_spec.validate)

    return dataclasses.replace(video_spec, distills=True, build_model=build_pipeline_distill_module,
                               describe=describe, validate=validate, prepare_data=prepare_distill_data,
                               finish=export_student, sampler=None, evaluator=None, loss=pipeline_distill_loss,
                               loss_kinds=distill_loss_kinds)


def video_script_trainer(cfg, video_spec: TrainerSpec) -> TrainerSpec:
    """train_video.py's trainer for ``cfg``: ``video_spec``, or its distillation of ``model.pipeline`` when
    ``distill.teacher`` is set (the video zoo's models are refused by the trainer)."""
    if cfg.distill.teacher and cfg.model.pipeline:
        return pipeline_distill_trainer(video_spec)
    return video_spec
