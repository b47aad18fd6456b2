"""The typed configuration schema of train.py and sample.py.

Every field carries a one-line help string (``help=`` metadata) that ``--help`` prints. Field names of
the top level follow LiteGen's so its users' YAML files load unchanged (``exp_name``, ``results_dir``,
``zero_degree``, ``selective_ratio``, ``ema.sharded``, ``encoder.fsdp``, ...). Precedence: command line
``key=value`` > YAML file > the defaults below. Other spellings of a field (LiteGen/OpenDiT names that
were renamed, and the names other trainers use) are listed in ``ALIASES`` at the end of this file;
the loader resolves them (``opendit_lite.config.loader.resolve_aliases``) and ``--help`` lists them.
"""

from dataclasses import dataclass, field
from typing import List, Optional

LOGGERS = ("tensorboard", "wandb")  # metric sinks the ``logger`` field may list

# Sequence-parallel modes (a model declares which it supports); ``sp_mode`` also takes "auto".
SP_MODES = ("ulysses", "ring", "usp", "dsp")
SP_MODE_CHOICES = SP_MODES + ("auto",)

# Learning-rate shapes after warm-up; the formulas are in opendit_lite/optim/lr_schedule.py.
LR_SCHEDULES = ("constant", "linear", "cosine")


def _f(default, help: str, choices=None, at_least=None, at_most=None, above=None, below=None, **kw):
    """A dataclass field with a help string, optionally the allowed values, and the range a number
    must lie in: ``at_least``/``at_most`` (inclusive) and ``above``/``below`` (exclusive) bounds,
    for the field or, for a list, every item. The loader checks every number against its bounds,
    and every float for finiteness, in one place (``loader.check_ranges``)."""
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    bounds = {k: v for k, v in (("at_least", at_least), ("at_most", at_most), ("above", above), ("below", below))
              if v is not None}
    if bounds:
        meta["range"] = bounds
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def _section(cls, help: str):
    return field(default_factory=cls, metadata={"help": help})


@dataclass
class ModelConfig:
    name: str = _f("DiT-S/2", "registered model name, e.g. DiT-XL/2 (see opendit_lite.models.MODELS)")
    input_size: Optional[List[int]] = _f(None, "latent (or pixel) size [H, W] the model is built for; None: from data",
                                         at_least=1)
    in_channels: Optional[int] = _f(None, "input channels; None: 4 with a VAE, 3 in pixel space", at_least=1)
    num_classes: Optional[int] = _f(None, "class-label vocabulary; None: from the dataset", at_least=1)
    learn_sigma: bool = _f(True, "predict the variance too (output channels doubled), as DiT")
    class_dropout_prob: float = _f(0.1, "label dropout probability for classifier-free guidance", at_least=0,
                                   at_most=1)
    timestep_spacing: str = _f("meta", "timestep frequency spacing: meta (the DiT reference's) or diffusers (a plain "
                               "DiTTransformer2DModel.from_pretrained of the export is then exact); DiT only",
                               choices=("meta", "diffusers"))


@dataclass
class DataConfig:
    # data.type -> what data.path must point at (checked by the loader)
    PATH_REQUIRED = {"image_folder": "a folder with one sub-folder of images per class",
                     "latents": "a folder written by scripts/extract_latents.py"}
    type: str = _f("shapes", "dataset kind", choices=("shapes", "image_folder", "latents"))
    path: Optional[str] = _f(None, "image folder (one sub-folder per class) or precomputed-latent folder")
    image_size: int = _f(32, "image side in pixels after DiT's centre crop (shapes: generated size)", at_least=1)
    num_samples: int = _f(4096, "shapes: number of generated samples", at_least=1)
    random_flip: bool = _f(True, "horizontal flip augmentation (image_folder)")


@dataclass
class VAEConfig:
    path: Optional[str] = _f(None, "local diffusers AutoencoderKL folder; None trains in pixel space")
    scale_factor: float = _f(0.18215, "latent scale applied after encoding (SD VAE's constant)", above=0)


@dataclass
class DiffusionConfig:
    objective: str = _f("iddpm", "training objective: iddpm (DiT's Gaussian diffusion) or rflow (rectified flow)",
                        choices=("iddpm", "rflow"))
    noise_schedule: str = _f("linear", "IDDPM beta schedule", choices=("linear", "cosine"))
    diffusion_steps: int = _f(1000, "number of diffusion timesteps used in training", at_least=1)
    timestep_sampling: str = _f("logit-normal", "rflow: distribution the training times are drawn from",
                                choices=("uniform", "logit-normal"))
    shift: Optional[float] = _f(None, "rflow: time shift s (t -> s t / (1 + (s - 1) t)) of training and sampling "
                                      "times; vpred: divides the SNR; null: none (a diffusers family: its recipe's)",
                                above=0)


@dataclass
class EMAConfig:
    enable: bool = _f(True, "keep an exponential moving average of the weights")
    sharded: bool = _f(True, "the fp32 EMA is sharded across the ZeRO group (4 B x params / ranks per rank; "
                             "the same values as an unsharded EMA); false is refused")
    resume_from: Optional[str] = _f(None, "EMA checkpoint to resume from (LiteGen's ema.resume_from)")
    decay: float = _f(0.9999, "EMA decay per optimizer step", at_least=0, at_most=1)
    warmup: Optional[bool] = _f(None, "ramp the decay up as diffusers' EMAModel does, min(decay, (1 + step) / "
                                      "(10 + step)), so that an EMA of weights starting at zero follows them from "
                                      "the first steps (it keeps ~90% of what a run learns, where decay 0.9999 "
                                      "alone keeps 1.5% of a 300-step run); null: on for LoRA runs (lora.rank > "
                                      "0, adapters start at zero), off for full training")


@dataclass
class EncoderConfig:
    fsdp: bool = _f(False, "shard frozen encoders' parameters across ranks (inference only): train_video.py's "
                           "T5/CLIP caption encoder and LiteGen's frozen modules; train.py has none")
    group: bool = _f(False, "with fsdp: shard within a node only")


@dataclass
class LoRAConfig:
    rank: int = _f(0, "adapter rank r; > 0 fine-tunes low-rank adapters (peft) on a frozen base, 0: full training",
                   at_least=0)
    alpha: float = _f(16.0, "adapter scale numerator: updates are scaled by alpha / rank", above=0)
    dropout: float = _f(0.0, "dropout on the adapters' input", at_least=0, below=1)
    targets: Optional[List[str]] = _f(None, "linear layers that get adapters: names, dotted suffixes (attn.proj) or "
                                            "regular expressions over full names; None: the model's usual targets "
                                            "(zoo: attention qkv/proj, MLP fc1/fc2; diffusers families: to_q/to_k/"
                                            "to_v/to_out.0, the text stream's projections and the feed-forward)")
    export_merged: Optional[bool] = _f(None, "at the end of training also write <run dir>/merged.safetensors: the "
                                             "adapters merged into the base (EMA weights where kept), for "
                                             "sample.ckpt or init_from; null: on for the zoo's models, off for the "
                                             "diffusers families (a whole copy of the base: their export is the "
                                             "pipeline's LoRA file, diffusers/pytorch_lora_weights.safetensors)")
    init_from: Optional[str] = _f(None, "a diffusers family's LoRA file (or the folder holding it) whose adapters "
                                        "this run's start from, to continue training them: the diffusers format "
                                        "(pytorch_lora_weights.safetensors) or the family's original layout "
                                        "(ComfyUI's comfyui_lora.safetensors); its rank must be lora.rank, its layers "
                                        "among lora.targets; ignored when the run resumes")
    base_precision: str = _f("none", "storage of the frozen base's linear weights in the blocks: none (the run's "
                                     "precision), fp8 (e4m3, a scale per row) or nf4 (bitsandbytes' 4-bit, QLoRA); "
                                     "computed in the run's precision, adapters unchanged, checkpoints and merged "
                                     "exports keep the original weights", choices=("none", "fp8", "nf4"))


@dataclass
class MemoryConfig:
    blocks_to_swap: int = _f(0, "LoRA runs: blocks whose frozen weights stay in pinned host memory and are copied to "
                                "the device ahead of each use, forward and backward (at most the model's blocks)",
                             at_least=0)
    gemini_offload_optim_frac: float = _f(0.0, "zero_degree 3 (Gemini): share of the fp32 optimizer states kept in "
                                               "host memory and stepped on the CPU", at_least=0, at_most=1)


@dataclass
class DistillConfig:
    """Few-step distillation by distribution matching (DMD2): a student that samples in
    ``student_timesteps`` Euler steps, trained against a frozen teacher (a trained run's EMA weights)
    and a critic that follows the student's samples (docs/distillation.md)."""

    teacher: Optional[str] = _f(None, "the teacher: a trained run folder (its newest checkpoint) or a checkpoint "
                                      "folder, of the same model as model.*, rectified flow; its EMA weights are "
                                      "the frozen teacher and the start of student and critic; for a model.pipeline "
                                      "run, that pipeline folder (its transformer, with LoRA student and critic); "
                                      "null: no distillation (plain training)")
    student_timesteps: int = _f(4, "the student's sampling steps N: it is trained at the N times the Euler sampler "
                                   "with sample.num_sampling_steps=N evaluates, and samples with exactly N",
                                at_least=1, at_most=1000)
    guidance_scale: float = _f(4.0, "the teacher's classifier-free guidance scale in the real score the student "
                                    "is pulled towards (the student then samples unguided, sample.cfg_scale=1)",
                               at_least=1)
    critic_updates: int = _f(4, "critic updates per student update (DMD2's two time-scale rule); each optimizer "
                                "step updates one of the two networks", at_least=1)
    gan_weight: float = _f(0.0, "DMD2's optional GAN term: a head on the critic's middle block tells the batch's "
                                "noised images from the student's noised samples (trained with the critic), and the "
                                "student's loss gains gan_weight x its non-saturating generator loss (the critic's "
                                "gains gan_weight x the head's); 0: off", at_least=0)


# sample.cache.kind: what each reuses is in docs/sampling.md.
CACHE_KINDS = ("none", "pab", "first_block", "teacache", "magcache")


@dataclass
class CacheConfig:
    """Step caching while sampling; each kind reads only its own settings (null: the kind's default,
    listed in docs/sampling.md), and a setting given for another kind is refused."""

    kind: str = _f("none", "none; pab (attention outputs reused between steps, Pyramid Attention Broadcast); "
                           "first_block (the blocks after the first skipped while its residual barely changes); "
                           "teacache (every block skipped while the first block's modulated input barely changes); "
                           "magcache (every block skipped while the calibrated residual magnitudes barely change)",
                   choices=CACHE_KINDS)
    threshold: Optional[float] = _f(None, "first_block, teacache, magcache: the relative change (first_block) or "
                                          "accumulated change (teacache, magcache) below which a step reuses the "
                                          "cache; higher skips more", above=0, at_most=1)
    spatial_skip: Optional[int] = _f(None, "pab: spatial (and joint) self-attention recomputed every n-th step "
                                           "inside timesteps, reused in between", at_least=1, at_most=50)
    temporal_skip: Optional[int] = _f(None, "pab: temporal self-attention recomputed every n-th step",
                                      at_least=1, at_most=50)
    cross_skip: Optional[int] = _f(None, "pab: cross-attention recomputed every n-th step", at_least=1, at_most=50)
    timesteps: Optional[List[float]] = _f(None, "pab: the window [low, high] of model timesteps on the 0-1000 scale "
                                                "(1000: pure noise) inside which attention may be reused",
                                          at_least=0, at_most=1000)
    max_skip_steps: Optional[int] = _f(None, "teacache, magcache: most consecutive steps that reuse the cache",
                                       at_least=1, at_most=100)
    retention_ratio: Optional[float] = _f(None, "magcache: the fraction of the first steps that always run in full",
                                          at_least=0, below=1)
    mag_ratios: Optional[List[float]] = _f(None, "magcache: the model's residual magnitude ratio per step (a "
                                                 "calibrating run prints them); null: calibrated on the run's first "
                                                 "batch, which is sampled in full", above=0, at_most=10)


@dataclass
class BaseSampleConfig:
    """The fields of every sampling section (sample.py's ``SampleConfig``, sample_video.py's
    ``VideoSampleConfig``); the sampler, its steps and the batch differ in their defaults."""

    ckpt: Optional[str] = _f(None, "checkpoint to sample from: a checkpoint folder, a LiteGen .pth file or (sample.py) "
                                   "an original DiT .pt; None: the newest of this run")
    use_ema: bool = _f(True, "sample with the EMA weights when the checkpoint has them")
    cfg_scale: float = _f(4.0, "classifier-free guidance scale against the null class or caption (1 disables "
                               "guidance)", at_least=0)
    seed: int = _f(0, "sampling seed (>= 0): sample i's noise comes from (seed, i), so any number of ranks "
                      "gives the same samples", at_least=0)
    compile: bool = _f(False, "torch.compile each block of the denoiser, as training's compile does")
    cfg_parallel: bool = _f(False, "run guidance's conditional and unconditional branches on two groups of ranks "
                                   "(2 x sp_size ranks per group of samples), exchanging only the predictions")
    cache: CacheConfig = _section(CacheConfig, "step caching: reuse the denoiser's work across sampling steps")


@dataclass
class SampleConfig(BaseSampleConfig):
    sampler: str = _f("ddpm", "ddpm or ddim for IDDPM; euler for rectified flow", choices=("ddpm", "ddim", "euler"))
    num_sampling_steps: int = _f(250, "respaced number of sampling steps", at_least=1)
    class_labels: Optional[List[int]] = _f(None, "labels to sample, one grid row each; None: every class", at_least=0)
    samples_per_class: int = _f(8, "images per class label (grid columns)", at_least=1)
    output: Optional[str] = _f(None, "PNG path of the grid; None: <run dir>/samples/<checkpoint name>.png")
    batch_size: int = _f(32, "samples per forward on each data-parallel rank (guidance runs twice as many rows)",
                         at_least=1)


@dataclass
class EvalConfig:
    samples_per_class: int = _f(50, "images generated per class label (DiT's FID-50K: 50 x 1000 classes)", at_least=1)
    reference: Optional[str] = _f(None, "reference for FID: an .npz with mu/sigma, an .npz with arr_0 "
                                        "(uint8 NHWC images) or a folder of images")
    inception_path: Optional[str] = _f(None, "local InceptionV3 weights for torch-fidelity "
                                             "(weights-inception-2015-12-05-6726825d.pth, checked by its sha256); "
                                             "nothing is downloaded")
    score: bool = _f(True, "score the samples (needs inception_path; without reference: Inception Score only); "
                           "false: only write samples.npz")
    samples: Optional[str] = _f(None, "an existing samples .npz (arr_0 uint8 NHWC) to score instead of generating")
    output_dir: Optional[str] = _f(None, "folder for samples.npz, metrics.json and PNGs; None: <run dir>/eval")
    save_png: bool = _f(False, "also write every sample as <index>.png")
    precision_recall: bool = _f(False, "also compute precision/recall (needs reference images, not only mu/sigma)")
    batch_size: int = _f(50, "images per Inception forward", at_least=1)


@dataclass
class TrainConfig:
    # experiment and paths (LiteGen names)
    exp_name: str = _f("dit", "experiment name: run folder and checkpoint prefix")
    results_dir: str = _f("outputs", "root folder of runs; this run writes to <results_dir>/<exp_name>")
    checkpoint_dir: Optional[str] = _f(None, "where checkpoints are written and searched; None: <run dir>/checkpoints")
    init_from: Optional[str] = _f(None, "weights to start from (model only; step 0)")
    resume_from: Optional[str] = _f(None, "checkpoint to resume model, optimizer and state from")
    auto_resume: bool = _f(False, "resume from the newest checkpoint that verifies when resume_from is empty")
    overwrite: bool = _f(False, "let a fresh run write into a checkpoint folder that already holds checkpoints of "
                                "exp_name (same-named steps are replaced); false refuses")
    # precision
    precision: str = _f("auto", "parameter/compute precision; auto: bf16 on CUDA, fp32 on CPU (where bf16 is "
                                "several times slower); fp8: bf16 with the blocks' Linear layers in float8 "
                                "(torchao; GPUs with compute capability >= 8.9, zero_degree 0-2)",
                        choices=("auto", "fp32", "tf32", "bf16", "fp16", "fp8"))
    grad_precision: Optional[str] = _f(None, "LiteGen's gradient-reduction dtype: gradients are reduced in the "
                                             "parameter dtype, so only null or that dtype is accepted",
                                       choices=(None, "fp32", "tf32", "bf16", "fp16"))
    allow_tf32: bool = _f(True, "allow TF32 matmuls and convolutions on Ampere+ GPUs")
    # optimizer
    lr: float = _f(1e-4, "AdamW learning rate", above=0)
    weight_decay: float = _f(0.0, "AdamW weight decay", at_least=0)
    fused_optimizer: bool = _f(True, "use the fused AdamW implementation where available")
    fused_optimizer_ema: bool = _f(False, "AdamW and the EMA update in one optimizer step, multi-tensor ops "
                                          "(zero_degree 0, 1, 2; replaces fused_optimizer's choice)")
    lr_schedule: str = _f("constant", "learning rate after warm-up: constant, or linear/cosine decay to "
                                      "min_lr_ratio x lr at max_steps", choices=LR_SCHEDULES)
    warmup_steps: int = _f(0, "linear learning-rate warm-up steps", at_least=0)
    min_lr_ratio: float = _f(0.0, "linear/cosine: the final learning rate as a fraction of lr", at_least=0, at_most=1)
    grad_clip: float = _f(1.0, "clip the global gradient norm to this value (0 disables)", at_least=0)
    # distributed strategy
    zero_degree: int = _f(0, "0: DDP, 1/2: ZeRO-1/2 (LowLevelZero), 3: ZeRO-3 (Gemini)", choices=(0, 1, 2, 3))
    group_zero: bool = _f(False, "shard ZeRO state within a node and replicate across nodes")
    sp_size: int = _f(1, "sequence-parallel degree (consecutive ranks form a group)", at_least=1)
    sp_mode: str = _f("ulysses", "sequence parallelism when sp_size > 1: ulysses (heads all-to-all; sp_size must "
                                 "divide the heads), ring (keys/values passed around the group; any sp_size), usp "
                                 "(Ulysses inside rings of sp_ring_size), dsp (re-shard frames/patches; models "
                                 "declaring it, e.g. STDiT), or auto (the mode whose communication costs the least "
                                 "time for the config's largest bucket, as python -m opendit_lite.plan prints; the "
                                 "report says which and why)", choices=SP_MODE_CHOICES)
    sp_ring_size: Optional[int] = _f(None, "sp_mode=usp: ring degree, a divisor of sp_size (Ulysses runs over "
                                           "sp_size / sp_ring_size ranks inside each ring step); None: the smallest "
                                           "ring the heads allow", at_least=1)
    # module conversion
    fused_layernorm: bool = _f(False, "swap affine LayerNorms for apex/Triton fused LayerNorm")
    fused_adaln: bool = _f(False, "swap LayerNorm+modulate for the Triton fused AdaLN kernel")
    attention_backend: str = _f("sdpa", "attention kernel", choices=("sdpa", "flash", "auto"))
    # activation memory
    ac_offload: bool = _f(False, "offload checkpointed blocks' saved inputs to pinned CPU memory")
    selective_ratio: float = _f(1.0, "activation checkpointing: the fraction of blocks NOT checkpointed "
                                     "(0: every block checkpointed, least memory; 1: none, fastest)",
                                at_least=0, at_most=1)
    # training
    global_seed: int = _f(0, "global random seed (data-parallel rank r uses global_seed * dp_size + r)", at_least=0)
    max_steps: int = _f(1000, "optimizer steps to train", at_least=1)
    global_batch_size: int = _f(32, "samples per optimizer step across all ranks", at_least=1)
    grad_accum_steps: int = _f(1, "micro-batches accumulated per optimizer step", at_least=1)
    num_workers: int = _f(0, "data-loader worker processes per rank", at_least=0)
    pin_memory: bool = _f(False, "pin data-loader memory")
    log_every: int = _f(50, "steps between logged metrics (the only host syncs of the loop)", at_least=1)
    ckpt_every: int = _f(0, "steps between checkpoints (0: only at the end)", at_least=0)
    eval_every: int = _f(0, "steps between evaluations (eval.*: FID of fresh samples) of the checkpoint saved at that "
                            "step; a multiple of ckpt_every; 0: off", at_least=0)
    keep_last: int = _f(0, "keep only this many newest checkpoints of this run (0: keep all)", at_least=0)
    nan_policy: str = _f("stop", "on a non-finite loss: stop (exit code 3, no checkpoint after it) or skip_step "
                                 "(drop that step's update; costs one host sync per step)",
                         choices=("stop", "skip_step"))
    max_bad_data_fraction: float = _f(0.01, "fraction of samples that may fail to decode (each skipped with a "
                                            "warning naming the file) before the run stops", at_least=0, at_most=1)
    compile: bool = _f(False, "torch.compile each repeated block (the last step of parallelize)")
    cuda_graphs: bool = _f(False, "with compile: replay the compiled blocks as CUDA graphs (torch.compile "
                                  "mode 'reduce-overhead'; CUDA and fixed shapes only)")
    logger: List[str] = _f(["tensorboard"], "metric sinks besides metrics.jsonl: tensorboard and/or wandb "
                                            "(a single name is accepted; wandb runs offline unless WANDB_MODE is set)")
    # sections
    model: ModelConfig = _section(ModelConfig, "model to train")
    data: DataConfig = _section(DataConfig, "training data")
    vae: VAEConfig = _section(VAEConfig, "latent autoencoder")
    diffusion: DiffusionConfig = _section(DiffusionConfig, "diffusion objective")
    ema: EMAConfig = _section(EMAConfig, "exponential moving average")
    lora: LoRAConfig = _section(LoRAConfig, "low-rank adapter fine-tuning")
    memory: MemoryConfig = _section(MemoryConfig, "weight memory: blocks swapped to host memory, Gemini's optimizer "
                                                  "offload (python -m opendit_lite.plan chooses them)")
    encoder: EncoderConfig = _section(EncoderConfig, "frozen encoders")
    sample: SampleConfig = _section(SampleConfig, "sample.py settings")
    eval: EvalConfig = _section(EvalConfig, "python -m opendit_lite.evaluate settings (sampling settings: sample.*)")
    distill: DistillConfig = _section(DistillConfig, "few-step distillation of a trained run (DMD2): student and "
                                                     "critic trained against a frozen teacher")


# Other spellings of our fields, dotted key -> dotted key (an alias and its field share a section).
# Renamed fields keep their LiteGen/OpenDiT names; the other trainers' names (diffusers, HF Trainer,
# MaxDiffusion) are accepted where they mean exactly our field. Names whose meaning differs are
# not aliases but hints in the unknown-key error (``HINTS``).
ALIASES = {
    # LiteGen / OpenDiT spellings
    "result_dir": "results_dir",
    "diffusion.scheduler": "diffusion.objective",
    "diffusion.sample_method": "diffusion.timestep_sampling",
    # other trainers
    "output_dir": "results_dir",  # runs still go to <output_dir>/<exp_name>
    "run_name": "exp_name",
    "seed": "global_seed",
    "learning_rate": "lr",
    "adam_weight_decay": "weight_decay",
    "max_train_steps": "max_steps",
    "gradient_accumulation_steps": "grad_accum_steps",
    "mixed_precision": "precision",
    "max_grad_norm": "grad_clip",
    "lr_warmup_steps": "warmup_steps",
    "dataloader_num_workers": "num_workers",
    "checkpointing_steps": "ckpt_every",
    "checkpoints_total_limit": "keep_last",
}

# Names other trainers use for something close to, but not exactly, one of our fields: the
# unknown-key error explains the difference instead of guessing.
_BATCH_HINT = ("global_batch_size (samples per optimizer step over all ranks = per-rank batch x data-parallel "
               "ranks x grad_accum_steps)")
HINTS = {
    "batch_size": _BATCH_HINT,
    "train_batch_size": _BATCH_HINT,
    "per_device_train_batch_size": _BATCH_HINT,
    "micro_batch_size": _BATCH_HINT,
    "use_ema": "ema.enable",
    "ema_decay": "ema.decay",
    "gradient_checkpointing": "selective_ratio=0 (checkpoint every block)",
    "resume_from_checkpoint": "resume_from=<checkpoint> or auto_resume=true",
}
