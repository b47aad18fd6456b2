"""train.py's few-step distillation (``distill.teacher``; DMD2, Yin et al. 2024) on the shared loop.

The trained module (``builders/distill_model.py``) holds the frozen teacher, the student and the critic; the
run's one optimizer holds the student's and the critic's parameters. Each optimizer step updates ONE
of them, by the step count: ``distill.critic_updates`` critic steps, then one student step, and again.
On a step only that network is in the loss's graph, so the other's gradients stay None, and AdamW
(plain, fused or foreach) skips parameters without a gradient: each network's Adam moments and step
count advance on its own steps only, as with two optimizers (tested). DDP runs with
``find_unused_parameters`` so that the network left out of a step is not waited for; ZeRO-1/2
(LowLevelZero) buckets and steps only the parameters whose gradient arrived, and saves the
not-yet-stepped ones with an empty state (``plugins/zero.py``). The run's EMA averages the student only
(``DistillModule.ema_averages``). Sequence parallelism (``sp_size``) converts the networks' attention and
token split/gather markers inside the module; the ranks of a group draw alike (same samples).

One step, for a batch of labels y (the data's images are used by the GAN term only):

* noise and the student's step k (drawn per optimizer step, the same on every rank) give its input
  x_k by backward simulation (its own Euler steps 0..k-1, no gradient), and its sample
  x_0 = x_k - t_k v_student(x_k, t_k);
* critic step: the critic's flow-matching loss on x_0 (detached) at a random noise level;
* student step: the distribution-matching loss of x_0 between the critic and the teacher guided with
  ``distill.guidance_scale`` (``diffusion/distribution_matching.py``), gradients through x_0 only.
* with ``distill.gan_weight`` w > 0 (DMD2's GAN term), a head on the critic's middle block
  (``GanHead``) judges noised samples at the same times: the critic step adds w x its non-saturating
  loss on the batch's noised images ("real") vs the student's ("fake"), in the critic's one call; the
  student step adds w x the generator's, through a critic pass differentiated with respect to its input
  only (the critic's parameters get no gradient).

The logged ``loss`` mixes the two kinds of step.
"""

import os

import torch

from ..builders.distill_model import CRITIC, STUDENT, TEACHER, build_distill_module, load_student
from ..config import ConfigError
from ..diffusion.distribution_matching import (
    backward_simulate,
    critic_loss,
    discriminator_loss,
    generator_gan_loss,
    generator_loss,
    predict_x0,
    sampler_times,
)
from ..diffusion.rectified_flow import RectifiedFlow
from ..diffusion.sampling_utils import sample_seed, standard_normal_like
from ..models import registered_class
from ..models.capabilities import condition_dropout_kwarg
from .spec import TrainerSpec

# The noise levels the losses judge samples at (``judge_times``'s range), drawn per sample.
JUDGE_LOW, JUDGE_HIGH = 0.02, 0.98


def is_student_step(step: int, critic_updates: int) -> bool:
    """Whether optimizer step ``step`` (0-based) updates the student (else the critic): the last of each
    ``critic_updates + 1`` steps."""
    return step % (critic_updates + 1) == critic_updates


def student_step_index(seed: int, step: int, steps: int) -> int:
    """The student's step k in 0..steps-1 trained at optimizer step ``step`` (one per step, the same on
    every rank and after a resume)."""
    generator = torch.Generator().manual_seed(sample_seed(seed, step, 0x5EED, 0xD15))  # keys no sample's draws use
    return int(torch.randint(steps, (1,), generator=generator))


def distill_loss(model, objective: RectifiedFlow, cfg, x: torch.Tensor, model_kwargs: dict, draws,
                 step: int) -> torch.Tensor:
    """The loss of optimizer step ``step`` for a batch of clean inputs x [B, C, H, W] (their shape) and
    labels ``model_kwargs["y"]`` [B]; ``model``: the (boosted) ``DistillModule``; ``draws``: the
    samples' own random streams."""
    d = cfg.distill
    n, channels, num_timesteps = x.shape[0], x.shape[1], objective.num_timesteps
    y = model_kwargs["y"]                                                           # [B]
    y_null = torch.full_like(y, cfg.model.num_classes)                               # DiT's null class
    # No label dropout in any call (the model is in training mode): the student learns every label's
    # guided samples; model.class_dropout_prob only gives the teacher its null class.
    kwarg = condition_dropout_kwarg(registered_class(cfg.model.name)) if cfg.model.class_dropout_prob else None

    def keep(rows: int) -> dict:
        return {} if kwarg is None else {kwarg: torch.zeros(rows, dtype=torch.bool, device=x.device)}

    def velocity(role):
        return lambda z, t: model(z, t, role=role, y=y, **keep(n))[:, :channels]      # [B, C, H, W]

    def guided_teacher(z, t):
        out = model(torch.cat([z, z]), torch.cat([t, t]), role=TEACHER, y=torch.cat([y, y_null]),
                    **keep(2 * n))[:, :channels]
        cond, uncond = out.chunk(2)                                                  # [B, C, H, W] each
        return uncond + d.guidance_scale * (cond - uncond)

    student = velocity(STUDENT)
    trains = STUDENT if is_student_step(step, d.critic_updates) else CRITIC
    inner = model.unwrap() if hasattr(model, "unwrap") else model
    inner.rest(trains)  # the adapter a block checkpointed in this step's graph recomputes with
    times = sampler_times(objective, d.student_timesteps)
    k = student_step_index(cfg.global_seed, step, d.student_timesteps)
    noise = standard_normal_like(x, draws)                                           # [B, C, H, W]
    x_k = backward_simulate(student, noise, times, k, num_timesteps)                 # the student's input at step k
    t_k = torch.full((n,), times[k], device=x.device, dtype=torch.float32)          # [B]
    judge_noise = standard_normal_like(x, draws)
    judge_t = JUDGE_LOW + (JUDGE_HIGH - JUDGE_LOW) * draws.uniform((n,), x.device, torch.float32)  # [B]
    gan = getattr(d, "gan_weight", 0.0)
    s = judge_t.view(-1, *([1] * (x.dim() - 1)))                                     # [B, 1, 1, 1]
    if trains == STUDENT:
        x0 = predict_x0(student, x_k, t_k, num_timesteps)                            # with gradient
        loss = generator_loss(x0, guided_teacher, velocity(CRITIC), judge_t, judge_noise, num_timesteps)
        if gan:
            # The critic and its head judge the noised sample as constants: their pass is differentiated
            # apart, with respect to its input only (no parameter accumulates a gradient, no DDP or ZeRO hook
            # fires, and a checkpointed block recomputes as it ran), and the student's loss gains a term
            # whose gradient is that one, through x0, and whose value is the generator's GAN loss. It runs
            # on the unwrapped module in its parameters' dtype (a DDP forward would re-plan the reduction).
            noised = (1 - s) * x0 + s * judge_noise                                  # [B, C, H, W]
            dtype = inner.critic_parameters()[0].dtype
            z = noised.detach().to(dtype).requires_grad_(True)
            inner.rest(CRITIC)  # its checkpointed blocks recompute in this autograd.grad
            with torch.enable_grad():
                _, fake_logits = inner(z, judge_t * num_timesteps, role=CRITIC, features=True, y=y, **keep(n))
                gan_loss = generator_gan_loss(fake_logits.float())
                (direction,) = torch.autograd.grad(gan_loss, z)
            inner.rest(STUDENT)
            term = (noised * direction.to(noised.dtype)).sum()
            loss = loss + gan * (gan_loss.detach() + term - term.detach())
        return loss
    with torch.no_grad():
        x0 = predict_x0(student, x_k, t_k, num_timesteps)
    if not gan:
        return critic_loss(x0, velocity(CRITIC), judge_t, judge_noise, num_timesteps)
    # The critic's flow matching on the student's noised samples and its head on those and on the batch's
    # noised images (same times), in one call.
    real_noise = standard_normal_like(x, draws)
    fake_t, real_t = (1 - s) * x0 + s * judge_noise, (1 - s) * x + s * real_noise  # [B, C, H, W] each
    out, logits = model(torch.cat([fake_t, real_t]), torch.cat([judge_t, judge_t]) * num_timesteps, role=CRITIC,
                        features=True, y=torch.cat([y, y]), **keep(2 * n))
    flow = ((out[:n, :channels] - (judge_noise - x0)) ** 2).mean()
    return flow + gan * discriminator_loss(logits[n:], logits[:n])


def validate_distill(cfg) -> None:
    """What distillation does not take (yet), refused before anything is built."""
    d = cfg.distill
    if cfg.diffusion.objective != "rflow":
        raise ConfigError(f"distillation (distill.teacher) trains a rectified-flow student: set "
                          f"diffusion.objective=rflow (got {cfg.diffusion.objective!r}), as the teacher was trained.")
    if cfg.model.learn_sigma:
        raise ConfigError("model.learn_sigma=true: a rectified-flow teacher predicts no variance; set "
                          "model.learn_sigma=false, as the teacher's run did.")
    if not cfg.model.class_dropout_prob:
        raise ConfigError("model.class_dropout_prob=0: the guided teacher needs the null class, which a model built "
                          "with class dropout has (an embedding row past the classes); set it as the teacher's run "
                          "did (e.g. 0.1). No label is dropped while distilling.")
    if cfg.init_from:
        raise ConfigError(f"init_from={cfg.init_from!r} in a distillation run: student and critic start from the "
                          f"teacher's weights (distill.teacher); remove init_from, or name that checkpoint as "
                          f"distill.teacher.")
    if cfg.zero_degree == 3:
        raise ConfigError("zero_degree=3 (Gemini) with distillation (distill.teacher): each step trains the student "
                          "or the critic and leaves the other without a gradient, which GeminiDDP refuses at the end "
                          "of each backward (its chunks are reduced once every parameter's gradient arrived); use "
                          "zero_degree=1 or 2 (LowLevelZero leaves such parameters and their Adam state untouched) "
                          "or 0.")
    if getattr(d, "gan_weight", 0) and cfg.sp_size > 1:
        raise ConfigError(f"distill.gan_weight={d.gan_weight} with sp_size={cfg.sp_size}: the GAN head pools the "
                          f"critic's middle-block tokens, which sequence parallelism splits over the ranks (each "
                          f"would judge its own share, with padding); not supported yet: set distill.gan_weight=0 "
                          f"or sp_size=1.")
    unsupported = {"lora.base_precision": cfg.lora.base_precision != "none", "compile": cfg.compile,
                   "eval_every": cfg.eval_every != 0}
    bad = [k for k, on in unsupported.items() if on]
    if bad:
        raise ConfigError(f"distillation (distill.teacher) does not support {', '.join(bad)} yet (one process, "
                          f"DDP or ZeRO-1/2, sequence parallelism, full weights or LoRA, block swapping with LoRA, "
                          f"fp32/bf16): remove {' and '.join(bad)} from the config.")
    if cfg.sample.num_sampling_steps != d.student_timesteps:
        raise ConfigError(f"sample.num_sampling_steps={cfg.sample.num_sampling_steps} but the student is trained for "
                          f"distill.student_timesteps={d.student_timesteps} Euler steps: set "
                          f"sample.num_sampling_steps={d.student_timesteps} (the student samples at exactly the times "
                          f"it was trained at).")


def export_student(cfg, checkpoint: str, run_dir: str) -> None:
    """The run's end: ``<run dir>/student.safetensors``, the student (EMA where kept; a LoRA student merged)
    with the model's own keys, which ``sample.ckpt`` and ``init_from`` load."""
    import torch.distributed as dist
    from safetensors.torch import save_file

    from ..builders.image import build_model_from_config
    from ..config import to_dict

    if dist.is_initialized() and dist.get_rank() != 0:
        return
    lora = to_dict(cfg.lora) if cfg.lora.rank else None
    model = load_student(build_model_from_config(cfg), checkpoint, use_ema=cfg.ema.enable, lora=lora)
    out = os.path.join(run_dir, "student.safetensors")
    save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, out)
    print(f"wrote the {cfg.distill.student_timesteps}-step student to {out} (sample.ckpt={out} "
          f"sample.num_sampling_steps={cfg.distill.student_timesteps} sample.cfg_scale=1; every checkpoint of the "
          f"run samples its student too)")


def distill_trainer(image_spec: TrainerSpec) -> TrainerSpec:
    """``image_spec`` (train.py's image trainer) distilling: the module of teacher, student and critic,
    the distillation loss, the student's export at the end."""
    import dataclasses

    def build(cfg):
        return build_distill_module(image_spec.build_model, cfg)

    def describe(cfg):
        d = cfg.distill
        kind = f"LoRA rank {cfg.lora.rank} adapters student/critic" if cfg.lora.rank else "full-weight student/critic"
        return (f"{image_spec.describe(cfg)}; distilling {d.teacher} to {d.student_timesteps} steps ({kind}, "
                f"teacher guidance {d.guidance_scale:g}, {d.critic_updates} critic updates per student update"
                f"{f', GAN term weight {d.gan_weight:g}' if d.gan_weight else ''})")

    return dataclasses.replace(image_spec, distills=True, build_model=build, describe=describe,
                               validate=validate_distill, finish=export_student, evaluator=None,
                               loss=distill_loss)
