"""The GPU report's two Wan sections (``benchmarks/gpu_report.py --part wan``; docs/gpu.md):

    wan_train   a Wan 2.1 1.3B-shaped diffusers ``WanTransformer3DModel`` (random init, the release
                config: 30 layers, 12 heads x 128, FFN 8960, text_dim 4096, 16 latent channels, patch
                (1, 2, 2)) trained at 480 x 832 on 33 and 81 frames (9 and 21 latent frames: 14,040
                and 32,760 tokens), full fine-tune and LoRA (rank 32), one step each of
                  diffusers  the loop a user writes: the model in bf16, diffusers' default attention
                             (SDPA), ``compile_repeated_blocks`` (torch.compile per block, diffusers'
                             recommended way), torch.optim.AdamW, peft adapters through
                             ``model.add_adapter`` for LoRA;
                  ours       ``parallelize`` (fused norm kernels with the never-slower-than-compile
                             dispatch, flash attention when installed, compile per block, LoRA) +
                             OpenDiTPlugin ZeRO-2 (bf16 working weights, fp32 master copies);
                the same flow-matching loss, inputs and 512 caption tokens. Rows: step time, video
                tokens/s, model TFLOP/s and MFU (attention's products counted, ``flops.wan_train_flops``),
                peak allocated memory, and ``vs_diffusers`` (ours over the diffusers loop at the same
                case, same run). A case that runs out of memory is rerun with every block checkpointed
                (the user's ``enable_gradient_checkpointing()``; our ``selective_ratio=0``), and its row
                says so.
    wan_24gb    a Wan 2.1 14B-shaped LoRA step (rank 32, batch 1, 21 x 80 x 80 latents: the config's
                square bucket with the tokens of 81 frames at 480 x 832, 33,600 against 32,760) with the
                settings ``python -m opendit_lite.plan`` gives for configs/wan14b_lora_24gb.yaml at
                24 GiB (block swapping, FP8 or NF4 base, checkpointing, offload: its config fragment is
                recorded) under a 24 GiB cap (``torch.cuda.set_per_process_memory_fraction``), then the
                step the planner gives for the whole device, uncapped: peak, step time, the planner's
                predicted peak, and the capped step's time over the uncapped one.

Each case's row is written as it ends; a case that would not finish in the section's time left is
skipped with a note. ``--dry-run`` runs both at toy sizes on the CPU (2 layers, one clip, the
planner on a toy config, no compile, no cap), so that the code path is tested in the suite.
"""

import contextlib
import copy
import dataclasses
import gc
import os
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import flops
import torch
import torch.nn.functional as F
from plan_accuracy import WAN_1_3B

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CAPTION_TOKENS, LORA_RANK, LR = 512, 32, 1e-4
GiB = 2 ** 30
TOY_WAN = dict(patch_size=[1, 2, 2], num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
               text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
               qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32)
CONFIG_24GB = os.path.join(ROOT, "configs", "wan14b_lora_24gb.yaml")
CAP_GIB = 24.0


@dataclasses.dataclass(frozen=True)
class Clip:
    """A clip in pixels; Wan's VAE makes (frames - 1) / 4 + 1 latent frames of height / 8 x width / 8."""

    frames: int
    height: int
    width: int

    def latent(self) -> Tuple[int, int, int]:
        return (self.frames - 1) // 4 + 1, self.height // 8, self.width // 8

    def name(self) -> str:
        return f"{self.frames}x{self.height}x{self.width}"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What one run of the sections measures (the GPU's or the dry run's)."""

    config: dict
    clips: Tuple[Clip, ...]
    caption: int
    warmup: int
    steps: int
    compile_backend: Optional[str]  # None: not compiled
    case_s: float                   # seconds a case needs at least (checked before starting it)


GPU_SIZES = Sizes(WAN_1_3B, (Clip(33, 480, 832), Clip(81, 480, 832)), CAPTION_TOKENS, 2, 3, "inductor", 40.0)
TOY_SIZES = Sizes(TOY_WAN, (Clip(5, 32, 32),), 8, 1, 1, None, 0.0)


# ----------------------------------------------------------------------------------------------
# The workload both loops train: the same inputs and flow-matching loss
# ----------------------------------------------------------------------------------------------

def make_batch(config: dict, clip: Clip, caption: int, device: torch.device, dtype: torch.dtype) -> dict:
    g = torch.Generator(device="cpu").manual_seed(0)
    t, h, w = clip.latent()
    x0 = torch.randn(1, config["in_channels"], t, h, w, generator=g)          # [B, C, T, H, W] latents
    noise = torch.randn(x0.shape, generator=g)
    text = torch.randn(1, caption, config["text_dim"], generator=g)            # [B, L, text_dim]
    time_ = torch.rand(1, generator=g)                                          # [B] in [0, 1)
    return dict(x0=x0.to(device, dtype), noise=noise.to(device, dtype), text=text.to(device, dtype),
                t=time_.to(device))


def flow_loss(model, batch: dict) -> torch.Tensor:
    """Rectified flow as Wan trains: x_t = (1 - t) x0 + t noise, the model predicts noise - x0."""
    t = batch["t"].view(-1, 1, 1, 1, 1)
    x_t = ((1 - t) * batch["x0"] + t * batch["noise"]).to(batch["x0"].dtype)   # [B, C, T, H, W]
    pred = model(hidden_states=x_t, timestep=batch["t"] * 1000, encoder_hidden_states=batch["text"],
                 return_dict=False)[0]                                          # [B, C, T, H, W]
    return F.mse_loss(pred.float(), (batch["noise"] - batch["x0"]).float())


def random_wan(config: dict, device: torch.device, dtype: torch.dtype):
    """Random weights in ``dtype``, except the modules diffusers keeps in fp32 (``_keep_in_fp32_modules``:
    what ``from_pretrained(torch_dtype=dtype)`` gives)."""
    import diffusers

    torch.manual_seed(0)
    with torch.device(device):  # initialised where it trains: seconds for 1.3B weights on a GPU
        model = diffusers.WanTransformer3DModel(**config)
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not any(k in name.split(".") for k in keep):
                p.data = p.data.to(dtype)
    return model.train()


def wan_lora_names(model) -> List[str]:
    """The linear layers both loops adapt: those diffusers' LoRA scripts adapt (the family's declaration)."""
    from opendit_lite.models.capabilities import lora_targets
    from opendit_lite.models.lora import lora_target_names

    return lora_target_names(model, lora_targets(model))


# ----------------------------------------------------------------------------------------------
# The two loops
# ----------------------------------------------------------------------------------------------

def diffusers_loop(config: dict, lora: bool, device: torch.device, compile_backend: Optional[str],
                   checkpointing: bool) -> Tuple[Callable[[dict], None], str]:
    """The loop a diffusers user writes; returns (step, its settings in words)."""
    from peft import LoraConfig

    model = random_wan(config, device, torch.bfloat16)
    if lora:
        model.requires_grad_(False)
        model.add_adapter(LoraConfig(r=LORA_RANK, lora_alpha=LORA_RANK, target_modules=wan_lora_names(model)))
    if checkpointing:
        model.enable_gradient_checkpointing()
    if compile_backend is not None:
        model.compile_repeated_blocks(backend=compile_backend)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)

    def step(batch: dict) -> None:
        flow_loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    words = "bf16 weights, SDPA, AdamW" + (", peft LoRA" if lora else "") + \
        (", gradient checkpointing" if checkpointing else "") + \
        (f", compile_repeated_blocks({compile_backend})" if compile_backend else ", not compiled")
    return step, words


def our_loop(config: dict, lora: bool, device: torch.device, compile_backend: Optional[str],
             selective_ratio: float, memory: Optional[dict] = None, rank: int = LORA_RANK
             ) -> Tuple[Callable[[dict], None], str]:
    """parallelize + OpenDiTPlugin ZeRO-2; ``memory``: blocks_to_swap, base_precision, ac_offload (the
    planner's settings for the 14B step). Returns (step, its settings in words)."""
    from colossalai.booster import Booster

    from opendit_lite.distributed.process_group import init_distributed
    from opendit_lite.parallelization import parallelize
    from opendit_lite.plugins import OpenDiTPlugin

    init_distributed()
    memory = memory or {}
    model = memory.pop("model", None) or random_wan(config, device, torch.float32)
    report = parallelize(model, fused_adaln=True, attention_backend="auto",
                         selective_ratio=selective_ratio, ac_offload=memory.get("ac_offload", False),
                         compile=compile_backend is not None, compile_backend=compile_backend,
                         lora_rank=rank if lora else 0, lora_alpha=rank,
                         base_precision=memory.get("base_precision", "none"),
                         blocks_to_swap=memory.get("blocks_to_swap", 0))
    zero = 2 if device.type == "cuda" else 0  # LowLevelZero needs CUDA; the dry run takes DDP
    plugin = OpenDiTPlugin(zero_degree=zero, precision="bf16")
    optimizer = plugin.build_optimizer([p for p in model.parameters() if p.requires_grad], lr=LR)
    booster = Booster(plugin=plugin)
    boosted, optimizer, *_ = booster.boost(model, optimizer)

    def step(batch: dict) -> None:
        booster.backward(flow_loss(boosted, batch), optimizer)
        optimizer.step()
        optimizer.zero_grad()

    done = [f"{r.step}: {r.swapped}" for r in report.rows if r.count]
    return step, f"{'ZeRO-2' if zero else 'DDP'} bf16; " + "; ".join(done)


# ----------------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------------

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(step: Callable[[dict], None], batch: dict, warmup: int, steps: int, device: torch.device,
            base_bytes: int = 0, eager_first: bool = False) -> Dict[str, Optional[float]]:
    """Median step milliseconds over ``steps`` after ``warmup`` steps, and the peak allocated GiB over all
    of them above ``base_bytes``. ``eager_first``: the first warm-up step runs eagerly, so that the kernel
    dispatch measures its choices before the compiled graphs read them (our loop only: the diffusers
    loop has no choices to make, and an eager step can need more memory than the compiled ones)."""
    from opendit_lite.kernels.kernel_choice import measured_eagerly

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with measured_eagerly() if eager_first else contextlib.nullcontext():
        step(batch)
    for _ in range(warmup - 1):
        step(batch)
    times = []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        step(batch)
        synchronize(device)
        times.append(1000 * (time.perf_counter() - start))
    peak = (torch.cuda.max_memory_allocated(device) - base_bytes) / GiB if device.type == "cuda" else None
    return dict(step_ms=round(statistics.median(times), 2), peak_gib=None if peak is None else round(peak, 2))


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def peak_tflops(device: torch.device, dry_run: bool) -> Optional[float]:
    if dry_run:
        return 1.0  # the dry run's made-up peak, as train_step.py's dry run: the code path, not a number
    return flops.device_peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


# ----------------------------------------------------------------------------------------------
# Section wan_train
# ----------------------------------------------------------------------------------------------

def train_case(ctx, sizes: Sizes, clip: Clip, lora: bool, impl: str, device: torch.device,
               reference: Optional[float]) -> dict:
    """One (clip, mode, loop) row: run, and rerun with every block checkpointed when out of memory."""
    t, h, w = clip.latent()
    config = sizes.config
    pt, ph, pw = config["patch_size"]
    tokens = (t // pt) * (h // ph) * (w // pw)
    train_flops = flops.wan_train_flops(config, t, h, w, sizes.caption, lora)
    row = dict(kind="wan_step", model="Wan2.1-1.3B-shaped" if not ctx.dry_run else "Wan-toy", clip=clip.name(),
               latent=f"{t}x{h}x{w}", tokens=tokens, caption=sizes.caption, mode="lora" if lora else "full",
               impl=impl, batch=1)
    batch = make_batch(config, clip, sizes.caption, device, torch.bfloat16)
    for checkpointed in (False, True):
        step = None
        release(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0  # what is not this case's
        try:
            if impl == "diffusers":
                step, words = diffusers_loop(config, lora, device, sizes.compile_backend, checkpointed)
            else:
                step, words = our_loop(config, lora, device, sizes.compile_backend, 0.0 if checkpointed else 1.0)
            result = measure(step, batch, sizes.warmup, sizes.steps, device, base_bytes=base,
                             eager_first=impl == "ours")
            break
        except Exception as error:  # noqa: BLE001  (out of memory: said, then rerun checkpointed)
            if not is_out_of_memory(error) or checkpointed:
                raise
            ctx.note(f"{clip.name()} {row['mode']} {impl}: out of memory without checkpointing; rerun with every "
                     f"block checkpointed")
        finally:
            step = None
            release(device)
    seconds = result["step_ms"] / 1000
    tflops = train_flops / seconds / 1e12
    peak = peak_tflops(device, ctx.dry_run)
    row.update(settings=words, checkpointed=checkpointed, step_ms=result["step_ms"],
               tokens_per_s=round(tokens / seconds, 1), tflops=round(tflops, 2),
               mfu=round(tflops / peak, 4) if peak else None, peak_gib=result["peak_gib"],
               train_tflop_per_step=round(train_flops / 1e12, 3),
               vs_diffusers=round(reference / result["step_ms"], 3) if reference else None)
    return row


_NOTED_CHOICES = set()  # the dispatch's choices already noted (a section runs in a process of its own)


def note_kernel_choices(ctx) -> None:
    """The kernel dispatch's choices made since the last call (measured on CUDA in our loop's eager first
    step: ``opendit_lite/kernels/kernel_choice.py``), one note each."""
    from opendit_lite.kernels import kernel_choice

    for key, c in kernel_choice.cache().choices.items():
        if key not in _NOTED_CHOICES:
            _NOTED_CHOICES.add(key)
            times = f"triton {c.triton_ms} ms, torch.compile {c.compile_ms} ms -> " if c.triton_ms else ""
            ctx.note(f"kernel choice {key}: {times}{c.provider} ({c.source})")


def section_train(ctx) -> None:
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    sizes = TOY_SIZES if ctx.dry_run else GPU_SIZES
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if ctx.dry_run:
        ctx.note("CPU: a 2-layer Wan at one toy clip, not compiled (dynamo's tracing alone would cost the suite "
                 "more than the rest of the section); the GPU run compiles with inductor")
    clips = [c for c in sizes.clips if not ctx.options.wan_frames or c.frames in ctx.options.wan_frames]
    for clip in clips:
        for lora in (False, True):
            reference = None
            for impl in ("diffusers", "ours"):
                if ctx.remaining() < sizes.case_s:
                    ctx.note(f"{clip.name()} {'lora' if lora else 'full'} {impl}: skipped, "
                             f"{ctx.remaining():.0f} s left in the section")
                    continue
                row = train_case(ctx, sizes, clip, lora, impl, device, reference)
                if impl == "diffusers":
                    reference = row["step_ms"]
                ctx.record(row)
                if impl == "ours":
                    note_kernel_choices(ctx)


# ----------------------------------------------------------------------------------------------
# Section wan_24gb: the planner's fragment under a 24 GiB cap, and uncapped
# ----------------------------------------------------------------------------------------------

def toy_tree() -> dict:
    """configs/wan14b_lora_24gb.yaml at toy sizes (the dry run's)."""
    from opendit_lite.config import read_yaml

    tree = copy.deepcopy(read_yaml(CONFIG_24GB))
    tree["model"] = dict(name="WanTransformer3DModel", config=dict(TOY_WAN, num_layers=4))
    tree["data"].update(num_frames=2, image_size=32)
    tree["text_encoder"] = dict(max_length=8)
    tree["lora"].update(rank=4, alpha=4)
    return tree


def planned(tree: dict, memory_gib: float, reserve_gib: float, host_gib: Optional[float]):
    """(setting, predicted peak GiB, config fragment, model config, latent clip) of the planner for ``tree``."""
    from opendit_lite.builders.family import config_schema
    from opendit_lite.config import from_dict
    from opendit_lite.plan import plan_config, plan_precision
    from opendit_lite.plan.fragment import config_fragment, peak_bytes
    from opendit_lite.plan.released import released_config

    cfg = from_dict(config_schema(tree), tree)
    result, buckets, _ = plan_config(cfg, memory_gib, 1, max_batch=1, reserve_gib=reserve_gib,
                                     precision=plan_precision(cfg), host_gib=host_gib)
    s = result.setting
    predicted = peak_bytes(result, s, result.costs.per_sample(s)) / GiB
    fragment = config_fragment(cfg, result, result.costs.per_sample, [], 1, memory_gib)
    release = released_config(cfg.model.path, cfg.model.name)
    config = dict(release.config) if release is not None else dict(tree["model"]["config"])
    return s, predicted, fragment, config, buckets[0]


def build_14b(config: dict, device: torch.device):
    """The model with random bf16 weights in host memory (drawn on the GPU: fast for 14B weights)."""
    import diffusers

    with torch.device("meta"):
        model = diffusers.WanTransformer3DModel(**config).to(torch.bfloat16)
    model = model.to_empty(device="cpu")
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, device=device, generator=g, dtype=torch.float32).mul_(0.02))
        for b in model.buffers():
            b.zero_()
    return model.train()


def lora_step_case(ctx, label: str, tree: dict, memory_gib: float, cap: bool, device: torch.device,
                   host_gib: Optional[float]) -> dict:
    """The planner's settings for ``memory_gib``, then one LoRA step with them (under the 24 GiB cap when
    ``cap``): a row with the settings, the predicted and the measured peak and the step time."""
    s, predicted, fragment, config, bucket = planned(tree, memory_gib, 0.0 if ctx.dry_run else 1.0, host_gib)
    ctx.note(f"{label}: the planner's fragment for {memory_gib:g} GiB: " + fragment.replace("\n", "<br>"))
    frames = tree["data"]["num_frames"]
    clip = Clip(4 * (frames - 1) + 1, bucket.height * 8, bucket.width * 8)
    batch = make_batch(config, clip, tree["text_encoder"]["max_length"], device, torch.bfloat16)
    row = dict(kind="lora_24gb", model="Wan2.1-14B-shaped" if not ctx.dry_run else "Wan-toy", case=label,
               latent=f"{bucket.frames}x{bucket.height}x{bucket.width}",
               cap_gib=CAP_GIB if cap and device.type == "cuda" else None,  # the cap is CUDA's allocator's
               planned_for_gib=float(f"{memory_gib:.4g}"), blocks_to_swap=s.blocks_to_swap,
               base_precision=s.base_precision,
               selective_ratio=s.selective_ratio, ac_offload=s.offload, zero_degree=s.zero_degree,
               predicted_gib=round(predicted, 4))
    release(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    if cap and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, CAP_GIB * GiB / total), device)
    step = None
    try:
        model = build_14b(config, device) if not ctx.dry_run else random_wan(config, device, torch.float32)
        memory = dict(model=model, blocks_to_swap=s.blocks_to_swap, base_precision=s.base_precision,
                      ac_offload=s.offload)
        del model
        step, words = our_loop(config, True, device, None, s.selective_ratio, memory, rank=tree["lora"]["rank"])
        result = measure(step, batch, 1, 1, device, base_bytes=base)  # one warm-up step, one timed
        row.update(status="ok", settings=words, step_s=round(result["step_ms"] / 1000, 3), peak_gib=result["peak_gib"])
        if result["peak_gib"]:
            row["predicted_over_measured"] = round(predicted / result["peak_gib"], 3)
    except Exception as error:  # noqa: BLE001  (out of memory under the cap is a result: recorded)
        if not is_out_of_memory(error):
            raise
        row.update(status="out of memory", error=str(error).splitlines()[0][:200])
    finally:
        step = None  # the model, its optimizer and its swapped blocks' pinned host copies go with it
        if cap and device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        release(device)
    return row


def section_24gb(ctx) -> None:
    from opendit_lite.config import read_yaml
    from opendit_lite.plan.__main__ import machine_host_gib

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    tree = toy_tree() if ctx.dry_run else read_yaml(CONFIG_24GB)
    host = machine_host_gib()
    if ctx.dry_run:
        ctx.note("CPU: a 4-layer Wan on configs/wan14b_lora_24gb.yaml's settings at toy sizes, planned for a "
                 "toy device; no memory cap (CUDA's allocator only), no peak")
        capped_gib = 0.00012  # so small that the planner swaps blocks and checkpoints, as at 24 GiB
        whole_gib = 1.0
    else:
        capped_gib = CAP_GIB
        whole_gib = torch.cuda.get_device_properties(device).total_memory / GiB
    capped = lora_step_case(ctx, f"capped at {CAP_GIB:g} GiB", tree, capped_gib, True, device, host)
    ctx.record(capped)
    if ctx.remaining() < (90.0 if not ctx.dry_run else 0.0):  # a 14B build, the planner and two steps
        ctx.note(f"uncapped step skipped: {ctx.remaining():.0f} s left in the section")
        return
    uncapped = lora_step_case(ctx, "uncapped", tree, whole_gib, False, device, host)
    if capped.get("step_s") and uncapped.get("step_s"):
        uncapped["capped_over_uncapped_time"] = round(capped["step_s"] / uncapped["step_s"], 3)
    ctx.record(uncapped)
