"""The networks of a few-step distillation run (``distill.teacher``, DMD2) as one trained module, and
the student out of its checkpoints.

``DistillModule`` holds the frozen teacher, the student and the critic, and runs one of them per call
(``role``): the trainer's one optimizer, DDP, the sharded EMA and the checkpoints then see one model
whose trainable parameters are the student's and the critic's. Two layouts:

* full weights (``lora.rank`` 0): three copies of the teacher's model under ``teacher.*`` (frozen),
  ``student.*`` and ``critic.*``;
* LoRA (``lora.rank`` > 0): one frozen base under ``base.*`` with two peft adapters, ``student`` and
  ``critic``, on the same layers; the base without adapters is the teacher. Memory is one model plus
  two adapters (and their optimizer states).

Both start from the teacher (a LoRA adapter starts as a no-op), as DMD2 initialises student and critic.
With ``distill.gan_weight`` > 0 the module also holds the critic's discriminator head (``gan_head.*``,
``GanHead``), which reads the critic's middle block. The run's EMA averages the student only
(``ema_averages``), and the module declares its networks' blocks (``get_fsdp_wrap_module_list``) for
activation checkpointing and block swapping.
The student is read back from any checkpoint of the run (``load_student``): its weights (EMA where kept),
with its adapter merged into the base, into a freshly built model, which samples as any zoo model does.
"""

import contextlib
import copy
import os
import warnings
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn

from ..checkpoint.catalog import is_checkpoint_dir
from ..checkpoint.layout import (
    checkpoint_root,
    find_resume_checkpoint,
    marked_checkpoint_folders,
    saved_config,
    wants_resume,
)
from ..checkpoint.weights import read_weights
from ..config import ConfigError
from ..models.blocks import find_blocks
from ..models.lora import apply_lora, lora_target_names, merge_lora
from .lora_checkpoint import load_merged

STUDENT, CRITIC, TEACHER = "student", "critic", "teacher"
ROLES = (STUDENT, CRITIC, TEACHER)
# The model sections that must be the teacher's: they decide the architecture and what it computes.
# (class_dropout_prob > 0 gives DiT its null class, which the teacher's guidance needs.)
GEOMETRY_KEYS = ("name", "input_size", "in_channels", "num_classes", "learn_sigma", "class_dropout_prob",
                 "timestep_spacing")


class GanHead(nn.Module):
    """DMD2's discriminator head on the critic's intermediate features: the tokens of one block's output
    [B, ..., D] normalised, averaged, then an MLP to one logit per sample [B] ("real" > 0). It trains with
    the critic (its parameters are the critic's in the optimizer's steps)."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        pooled = self.norm(features).flatten(1, -2).mean(dim=1)                     # [B, D]
        return self.mlp(pooled).squeeze(-1)                                          # [B]


def block_width(block: nn.Module) -> int:
    """The width of a residual block's output (its input's): the input width of its first linear layer."""
    linear = next((m for m in block.modules() if isinstance(m, nn.Linear)), None)
    if linear is None:
        raise ConfigError(f"distill.gan_weight > 0 puts a head on a middle block's output, but the block "
                          f"{type(block).__name__} has no linear layer to read its width from: set "
                          f"distill.gan_weight=0.")
    return linear.in_features


class DistillNetworks(nn.Module):
    """The three networks of a distillation, as one module: with LoRA (``student`` None) the frozen ``base``
    carrying the adapters ``student`` and ``critic`` (the teacher: no adapter); with full weights three
    networks under ``teacher`` (frozen), ``student`` and ``critic``. What the zoo's ``DistillModule`` and a
    pipeline's distillation module (``training/distill_pipeline.py``) share: which blocks checkpointing and
    block swapping act on, what the EMA averages, which adapter runs between calls. Each subclass has its
    own ``forward`` (the zoo's ``(x, t)``; a pipeline transformer's keywords)."""

    def __init__(self, teacher: nn.Module, student: Optional[nn.Module] = None, critic: Optional[nn.Module] = None):
        super().__init__()
        self.lora = student is None
        if self.lora:
            self.base = teacher
            self._layers = None  # its LoRA layers, found at the first forward (once the model is built)
        else:
            self.teacher, self.student, self.critic = teacher, student, critic
            self.teacher.requires_grad_(False)

    def networks(self) -> Tuple[Tuple[str, nn.Module], ...]:
        """The networks this module runs, by name: the shared base (LoRA), else teacher, student, critic."""
        if self.lora:
            return (("base", self.base),)
        return tuple((role, getattr(self, role)) for role in (TEACHER, STUDENT, CRITIC))

    def get_fsdp_wrap_module_list(self):
        """The repeated blocks (``models/blocks.find_blocks``), which activation checkpointing and block
        swapping act on: the shared base's (LoRA), else the teacher's, student's and critic's in turn."""
        return [block for _, network in self.networks() for block in find_blocks(network)]

    def ema_averages(self, name: str) -> bool:
        """The run's EMA averages the student only (``ema/boosted.py``): the student is what samples and is
        exported; the critic is only ever used as it is now."""
        return name.startswith(f"{STUDENT}.") if not self.lora else f".{STUDENT}." in name

    def lora_layers(self):
        """The base's LoRA layers (found once, after the model is built)."""
        if self._layers is None:
            self._layers = _lora_layers(self.base)
        return self._layers

    def rest(self, role: str) -> None:
        """Make ``role``'s adapter the one the LoRA layers run when no call is in progress (a call switches to
        its own role and back to this). The loss sets it to the role its step trains: a checkpointed block
        recomputes its forward in backward, after the calls, and must run that role's adapter again. No-op
        for full weights (separate networks)."""
        if self.lora:
            for m in self.lora_layers():
                m._disable_adapters = role == TEACHER
                if role != TEACHER:
                    m._active_adapter = [role]

    def run_role(self, role: str, *args, **kwargs):
        """``role``'s network called on ``args``/``kwargs``: the base with that role's adapter (the teacher:
        none), or that role's own network."""
        if self.lora:
            with active_adapter(self.lora_layers(), None if role == TEACHER else role):
                return self.base(*args, **kwargs)
        return getattr(self, role)(*args, **kwargs)


class DistillModule(DistillNetworks):
    """Teacher, student and critic of a zoo model as one module (``DistillNetworks``); ``forward(x, t,
    role=..., **kwargs)`` runs ``role``'s network. ``teacher``: the model with the teacher's weights;
    full-weight runs also pass ``student`` and ``critic`` (copies), LoRA runs none (the teacher's model
    already carries both adapters). ``gan_head`` (``distill.gan_weight > 0``): the critic's discriminator
    head; ``forward(..., role=CRITIC, features=True)`` then also returns its logits [B] on the output of
    the critic's middle block."""

    fp32_inputs = ("t",)  # the models' timesteps: a ZeRO wrapper's bf16 cast keeps them (plugins/fp32_inputs.py)

    def __init__(self, teacher: nn.Module, student: Optional[nn.Module] = None, critic: Optional[nn.Module] = None,
                 gan_head: Optional[GanHead] = None):
        super().__init__(teacher, student, critic)
        if gan_head is not None:
            self.gan_head = gan_head

    def critic_network(self) -> nn.Module:
        """The model the critic runs in: the shared base (LoRA) or the critic's copy."""
        return self.base if self.lora else self.critic

    def critic_parameters(self):
        """The trainable parameters a critic step updates: the critic's (weights or adapter) and its head's."""
        return [p for name, p in self.named_parameters() if p.requires_grad and self.trains_critic(name)]

    def trains_critic(self, name: str) -> bool:
        return name.startswith(("critic.", "gan_head.")) if not self.lora else (
            f".{CRITIC}." in name or name.startswith("gan_head."))

    def forward(self, x: torch.Tensor, t: torch.Tensor, role: str, features: bool = False, **kwargs):
        if features:  # the critic's output and its head's logits on its middle block's output
            if role != CRITIC or not hasattr(self, "gan_head"):
                raise ValueError("features=True is the critic's GAN head: role='critic' with a gan_head")
            blocks = find_blocks(self.critic_network())  # found per call: wrappers may have replaced them
            captured = []
            hook = blocks[len(blocks) // 2].register_forward_hook(
                lambda module, args, out: captured.append(out[0] if isinstance(out, tuple) else out))
            try:
                out = self.run_role(role, x, t, **kwargs)
            finally:
                hook.remove()
            return out, self.gan_head(captured[0])                                  # [B, ...], [B]
        return self.run_role(role, x, t, **kwargs)


def _lora_layers(model: nn.Module):
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def active_adapter(layers, name: Optional[str]):
    """Run a model's LoRA ``layers`` (``_lora_layers``) with adapter ``name`` only (None: none, the frozen
    base). Sets the layers' active adapter directly: peft's ``set_adapter`` would also flip
    ``requires_grad``, which the optimizer and DDP fixed when they were built."""
    saved = [(m._active_adapter, m._disable_adapters) for m in layers]
    for m in layers:
        m._disable_adapters = name is None
        if name is not None:
            m._active_adapter = [name]
    try:
        yield
    finally:
        for m, (active, disabled) in zip(layers, saved):
            m._active_adapter, m._disable_adapters = active, disabled


def add_adapters(model: nn.Module, names, *, rank: int, alpha: float, dropout: float, targets) -> None:
    """Adapters ``names`` (each rank ``rank``, scale alpha / rank) on the same linear layers of ``model``,
    the base frozen, every adapter trainable. ``apply_lora`` adds the first (it chooses the layers); the
    others go on the layers it adapted, named in full (they are peft layers then, no longer ``nn.Linear``,
    which ``apply_lora``'s target matching looks for)."""
    from peft import LoraConfig, inject_adapter_in_model

    from ..models.capabilities import lora_targets

    layers = lora_target_names(model, lora_targets(model) if targets is None else tuple(targets))
    apply_lora(model, rank=rank, alpha=alpha, dropout=dropout, targets=layers, adapter_name=names[0])
    for name in names[1:]:
        config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=layers, bias="none")
        with warnings.catch_warnings():  # peft warns that a second adapter is added: here that is the point
            warnings.filterwarnings("ignore", message="Already found a `peft_config`")
            inject_adapter_in_model(config, model, adapter_name=name)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)


def teacher_checkpoint(teacher: str) -> str:
    """The checkpoint folder ``distill.teacher`` names: itself, or the newest complete checkpoint of a run
    folder (``<run>/checkpoints``, the experiment named by its ``config.yaml``, else by the folder)."""
    if not os.path.exists(teacher):
        raise ConfigError(f"'distill.teacher' {teacher!r} does not exist: name a trained run folder (e.g. "
                          f"outputs/demo, which `make demo` writes) or one of its checkpoint folders.")
    if is_checkpoint_dir(teacher):
        return teacher
    exp_name = os.path.basename(os.path.normpath(teacher))
    config = os.path.join(teacher, "config.yaml")
    if os.path.isfile(config):
        import yaml

        with open(config) as f:
            exp_name = (yaml.safe_load(f) or {}).get("exp_name", exp_name)
    ckpt = find_resume_checkpoint(os.path.join(teacher, "checkpoints"), exp_name)
    if ckpt is None:
        raise ConfigError(f"'distill.teacher' {teacher!r} holds no complete checkpoint of experiment {exp_name!r} "
                          f"(looked in {os.path.join(teacher, 'checkpoints')}): train the teacher first, or name "
                          f"a checkpoint folder.")
    return ckpt


def check_teacher(ckpt: str, model: Dict, objective: str) -> Dict:
    """The teacher checkpoint's saved config, after checking it trained the run's model (``model``: the
    run's resolved model section) with rectified flow."""
    saved = saved_config(ckpt)
    if "model" not in saved:
        raise ConfigError(f"'distill.teacher' {ckpt!r} has no saved config (not a train.py checkpoint): distill a "
                          f"run trained by train.py.")
    theirs = saved["model"]
    differ = [k for k in GEOMETRY_KEYS if k in theirs and theirs[k] != model.get(k)]
    if differ:
        pairs = ", ".join(f"model.{k}: teacher {theirs[k]!r}, run {model.get(k)!r}" for k in differ)
        raise ConfigError(f"the teacher {ckpt!r} is another model than this run ({pairs}): student and critic start "
                          f"from the teacher's weights, so the run's model section must be the teacher's.")
    theirs_objective = saved.get("diffusion", {}).get("objective")
    if objective != "rflow" or theirs_objective != "rflow":
        raise ConfigError(f"distillation (distill.teacher) needs rectified flow for teacher and run "
                          f"(diffusion.objective=rflow); the teacher {ckpt!r} was trained with {theirs_objective!r} "
                          f"and the run sets {objective!r}.")
    return saved


def check_resumed_distillation(cfg) -> None:
    """A resumed distillation run (resume_from, or auto_resume with checkpoints) continues the same
    distillation: its checkpoint is a distillation run's with the same student steps, guidance and critic
    updates (the teacher's weights come from the checkpoint itself)."""
    if not wants_resume(cfg):
        return
    ckpt = cfg.resume_from or marked_checkpoint_folders(checkpoint_root(cfg), cfg.exp_name)[-1]
    saved = saved_config(ckpt).get("distill") or {}
    if not saved.get("teacher"):
        raise ConfigError(f"the run resumes {ckpt!r}, which is not a distillation run's checkpoint (no "
                          f"distill.teacher in its config): resume a distillation checkpoint, or start afresh in "
                          f"another exp_name (the teacher's weights seed a new distillation).")
    saved = {"gan_weight": 0.0, **saved}  # checkpoints from before the GAN term had none
    changed = [f"distill.{k}: checkpoint {saved[k]!r}, config {getattr(cfg.distill, k)!r}"
               for k in ("student_timesteps", "guidance_scale", "critic_updates", "gan_weight")
               if k in saved and saved[k] != getattr(cfg.distill, k)]
    if changed:
        raise ConfigError(f"the run resumes {ckpt!r} with other distillation settings ({'; '.join(changed)}): a "
                          f"resumed run continues the same student; set them back, or start afresh in another "
                          f"exp_name.")


def build_distill_module(build_model, cfg) -> DistillModule:
    """The distillation module of config ``cfg`` (``build_model(cfg)`` builds a fresh model of the run):
    teacher weights from ``distill.teacher`` (the EMA, a LoRA teacher merged), student and critic from them."""
    import dataclasses

    check_resumed_distillation(cfg)
    ckpt = teacher_checkpoint(cfg.distill.teacher)
    saved = check_teacher(ckpt, dataclasses.asdict(cfg.model), cfg.diffusion.objective)

    def teacher_model() -> nn.Module:
        return load_merged(build_model(cfg), ckpt, use_ema=True, lora=saved.get("lora"))

    def head(model: nn.Module) -> Optional[GanHead]:
        if not getattr(cfg.distill, "gan_weight", 0):
            return None
        blocks = find_blocks(model)
        return GanHead(block_width(blocks[len(blocks) // 2]))

    if cfg.lora.rank:
        base = teacher_model()
        add_adapters(base, (STUDENT, CRITIC), rank=cfg.lora.rank, alpha=cfg.lora.alpha, dropout=cfg.lora.dropout,
                     targets=cfg.lora.targets)
        return DistillModule(base, gan_head=head(base))
    teacher = teacher_model()  # read once; student and critic start as copies of it
    return DistillModule(teacher, copy.deepcopy(teacher), copy.deepcopy(teacher), gan_head=head(teacher))


def student_state(state: Dict[str, torch.Tensor], lora: Optional[Dict]) -> Dict[str, torch.Tensor]:
    """The student's entries of a distillation checkpoint's state dict, named as in ``DistillModule``'s
    student (full weights) or base with the student adapter only (LoRA), prefix removed."""
    prefix = "base." if lora and lora.get("rank") else "student."
    out = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return {k: v for k, v in out.items() if f".{CRITIC}." not in k}


def load_student(model: nn.Module, ckpt: str, *, use_ema: bool, lora: Optional[Dict]) -> nn.Module:
    """``model`` (freshly built, the run's model) with the student of distillation checkpoint ``ckpt``
    (the EMA where kept and ``use_ema``; its adapter merged into the base for a LoRA run)."""
    state = student_state(read_weights(ckpt, use_ema=use_ema), lora)
    dtype = next(model.parameters()).dtype
    if lora and lora.get("rank"):
        add_adapters(model, (STUDENT,), rank=lora["rank"], alpha=lora["alpha"], dropout=lora["dropout"],
                     targets=lora["targets"])
        model.load_state_dict({k: v.to(dtype) for k, v in state.items()})
        with active_adapter(_lora_layers(model), STUDENT):
            return merge_lora(model)
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    return model


def check_student_sampling(cfg, saved: dict) -> None:
    """A distillation checkpoint samples its student with the step count it was trained for, Euler and unguided."""
    steps = saved["distill"]["student_timesteps"]
    if cfg.sample.num_sampling_steps != steps:
        raise ConfigError(f"this checkpoint's student was distilled to {steps} steps (distill.student_timesteps), but "
                          f"sample.num_sampling_steps={cfg.sample.num_sampling_steps}: the student is trained only at "
                          f"the times of {steps} Euler steps; set sample.num_sampling_steps={steps}.")
    if cfg.sample.cfg_scale != 1:
        raise ConfigError(f"sample.cfg_scale={cfg.sample.cfg_scale}: the student learned the teacher's guided "
                          f"samples (distill.guidance_scale={saved['distill']['guidance_scale']}) and has no null "
                          f"class of its own; sample it unguided with sample.cfg_scale=1.")
