"""OpenDiTPlugin: DDP, ZeRO-1/2, Gemini ZeRO-3 and grouped ZeRO behind one Colossal-AI booster plugin,
with a data x sequence mesh and a sharded EMA.

    from colossalai.booster import Booster
    from opendit_lite.plugins import OpenDiTPlugin

    plugin = OpenDiTPlugin(zero_degree=2, sp_size=1, grad_clip=1.0)  # precision: bf16 on CUDA, fp32 on CPU
    optimizer = plugin.build_optimizer(model.parameters(), lr=1e-4, weight_decay=0.0)
    loader = plugin.prepare_dataloader(dataset, batch_size=global_batch_size // plugin.dp_size, seed=seed)
    booster = Booster(plugin=plugin)
    model, optimizer, _, loader, _ = booster.boost(model, optimizer, dataloader=loader)
    for batch in loader:
        loss = ...
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        plugin.update_ema(model, decay=0.9999)
    torch.save(plugin.ema.state_dict(only_rank_0=True), "ema.pt")  # on rank 0

Decisions:

- **Strategies.** ``zero_degree`` 0: PyTorch DDP, fp32 weights with autocast (``ddp.py``); 1 and 2:
  Colossal-AI's LowLevelZero stage 1 / 2 (``zero.py``); 3: Gemini, chunk-based ZeRO-3 with
  placement policy and offload fractions (``gemini.py``, CUDA only, bf16/fp16 only).
- **Mesh.** ``sp_size`` groups consecutive ranks into sequence-parallel groups ([0..sp-1],
  [sp..2sp-1], ...); a data-parallel group takes the ranks with the same ``sp_rank``.
  ``prepare_dataloader`` shards the dataset over the DP axis only (``num_replicas=dp_size``,
  ``rank=dp_rank``) and seeds data-loader workers per DP rank, so the ranks of one SP group get
  identical batches, random augmentations included.
- **Gradient reduction and ZeRO group.** Gradients are averaged over the whole world (dp x sp)
  and ZeRO shards over the whole world. This is exact under sequence parallelism because the
  sequence-parallel collectives leave on each SP rank an equal share of the gradient whose average
  over the SP group is the full gradient, so the world mean equals the DP mean; and sharding over
  all ranks, not just the DP axis, divides the optimizer memory by the full world size.
- **Grouped ZeRO** (``group_zero=True``, any ``zero_degree`` > 0): ZeRO shards inside a node
  (``node_size`` consecutive ranks) and every node keeps a replica; gradient shards are averaged
  across nodes once per step. Colossal-AI's ``extra_dp_size`` does not shard per node (see
  ``zero.py``), so the groups are built here.
- **EMA.** The plugin keeps one fp32 EMA of the trainable parameters of the model it boosted with
  an optimizer, sharded over the ZeRO group with the partition of the fp32 master weights and
  updated from the master shard (no communication per step); under DDP it is a flat partition of
  all parameters over the world. The EMA itself is ``opendit_lite.ema`` (``create_ema``/``update_ema``
  delegate to it): ``plugin.ema.state_dict()`` gathers the full state dict on every rank
  (``only_rank_0=True``: on global rank 0 only); ``plugin.ema.load_state_dict`` takes a full state
  dict saved at any world size. With ``build_optimizer(..., fused_ema=True)`` (DDP, ZeRO-1/2) the
  optimizer advances the EMA inside its step (``opendit_lite.optim.AdamWEMA``) and ``update_ema``
  only checks that it did.
- **Gradient accumulation.** DDP and ZeRO-1: ``with booster.no_sync(model, optimizer):`` around the
  backward passes before the last one (no communication). ZeRO-2 cannot skip its reduce-scatter
  (the gradient is sharded as it is produced), and Gemini has no ``no_sync``: call backward several
  times and step once; LowLevelZero adds the reduced gradients up internally, Gemini does so with
  ``gemini_kwargs={"enable_gradient_accumulation": True}``. Scale the loss by 1/accum_steps.
- **Process group.** When no default process group exists the plugin creates it with
  ``opendit_lite.distributed.process_group.init_distributed()``: from torchrun's environment, or a world
  of one for a plain ``python`` process (gloo on CPU, NCCL on CUDA). The plugin does not call
  ``colossalai.launch``.
- **Precision.** A name ("fp32", "tf32", "bf16", "fp16" with dynamic loss scaling in every
  strategy, "fp8", or "auto", the default: bf16 on CUDA, fp32 on the CPU) or a ``Precision``
  already resolved by ``opendit_lite.precision.resolve_precision`` (the trainers pass theirs).
  Under ZeRO and Gemini the model is cast to ``param_dtype`` and fp32 master weights live in the
  optimizer; under DDP the weights stay fp32 and the forward runs under autocast. tf32 allows
  TF32 matmuls on CUDA when the plugin is built; fp8 is bf16 whose blocks' Linear layers
  ``opendit_lite.precision.apply_fp8_training`` has made float8 before the optimizer was built.
"""

from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn
from colossalai.accelerator import get_accelerator
from colossalai.booster.plugin.dp_plugin_base import DPPluginBase
from colossalai.booster.plugin.gemini_plugin import GeminiCheckpointIO
from colossalai.checkpoint_io import CheckpointIO
from colossalai.interface import ModelWrapper, OptimizerWrapper
from torch.optim import Optimizer
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from ..distributed.mesh import block_groups, build_data_seq_mesh, default_node_size
from ..distributed.process_group import init_distributed
from ..ema import ShardedEMA, create_sharded_ema, update_sharded_ema
from ..optim import AdamWEMA
from ..precision import (
    PRECISION_NAMES,
    Precision,
    check_fp8_supported,
    enable_tf32_matmuls,
    has_fp8_linears,
    resolve_precision,
)
from . import gemini as _gemini
from . import zero as _zero
from .ddp import apply_ddp
from .ddp_checkpoint_io import DDPCheckpointIO
from .devices import usable_zero_degrees, zero_degree_hint
from .gemini import apply_gemini
from .zero import ZeroCheckpointIO, apply_low_level_zero

ZERO_DEGREES = (0, 1, 2, 3)


class OpenDiTPlugin(DPPluginBase):
    """Colossal-AI booster plugin: DDP / ZeRO-1 / ZeRO-2 / Gemini, SP mesh, sharded EMA (see module doc).

    Args:
        zero_degree: 0 DDP, 1 ZeRO-1, 2 ZeRO-2, 3 Gemini (ZeRO-3); None means 0.
        sp_size: sequence-parallel degree; must divide the world size.
        precision: "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "tf32", "bf16", "fp16", "fp8" (Gemini:
            bf16 or fp16), or a resolved ``opendit_lite.precision.Precision``.
        grad_clip: clip the global gradient norm to this value; 0 turns clipping off.
        group_zero: shard ZeRO state inside each node and replicate it across nodes.
        node_size: ranks per node for ``group_zero``; default LOCAL_WORLD_SIZE or the GPU count.
        gemini_placement_policy: "static" or "auto" (zero_degree 3).
        gemini_offload_optim_frac / gemini_offload_param_frac: fractions of optimizer-state /
            parameter chunks kept on the CPU under the "static" policy (zero_degree 3).
        overlap_communication: ZeRO-1/2 reduce gradient buckets on a side stream during backward
            (CUDA only; on the CPU collectives are synchronous anyway).
        ddp_kwargs / zero_kwargs / gemini_kwargs: extra arguments for torch's
            DistributedDataParallel / Colossal-AI's LowLevelZeroOptimizer / GeminiDDP.
    """

    def __init__(
        self,
        zero_degree: Optional[int] = 0,
        sp_size: int = 1,
        precision: Union[str, Precision] = "auto",
        grad_clip: float = 0.0,
        group_zero: bool = False,
        node_size: Optional[int] = None,
        gemini_placement_policy: str = "static",
        gemini_offload_optim_frac: float = 0.0,
        gemini_offload_param_frac: float = 0.0,
        overlap_communication: bool = True,
        ddp_kwargs: Optional[dict] = None,
        zero_kwargs: Optional[dict] = None,
        gemini_kwargs: Optional[dict] = None,
    ) -> None:
        zero_degree = 0 if zero_degree is None else zero_degree
        if zero_degree not in ZERO_DEGREES or isinstance(zero_degree, bool):
            raise ValueError(
                f"zero_degree={zero_degree!r} is not supported; use 0 (DDP), 1 (ZeRO-1), 2 (ZeRO-2) or 3 "
                f"(Gemini ZeRO-3)"
            )
        if not isinstance(precision, Precision):
            precision = resolve_precision(precision)  # ValueError for an unknown name
        if grad_clip < 0:
            raise ValueError(f"grad_clip={grad_clip} must be >= 0 (0 turns clipping off)")
        if zero_degree == 3 and not torch.cuda.is_available():
            raise ValueError(
                f"zero_degree=3 (Gemini) needs a CUDA GPU and none is visible; {zero_degree_hint()}"
            )
        if zero_degree == 3 and precision.autocast_dtype is None:
            raise ValueError("zero_degree=3 (Gemini) trains in bf16 or fp16 with fp32 master weights; set precision "
                             "to 'bf16' or 'fp16'")
        if precision.fp8:
            check_fp8_supported(get_accelerator().get_current_device())  # a ConfigError (ValueError) otherwise
        if group_zero and zero_degree == 0:
            zero = [d for d in usable_zero_degrees() if d > 0]
            fix = (f"it needs zero_degree {' or '.join(map(str, zero))}" if zero else
                   "ZeRO needs a CUDA GPU and none is visible, so set group_zero=false on this machine")
            raise ValueError(f"group_zero shards ZeRO state per node and DDP shards nothing; {fix}")
        if not dist.is_initialized():  # plain `python`: a world of one (torchrun: its environment)
            init_distributed()
        super().__init__()  # sets self.rank and self.world_size

        self.zero_degree = zero_degree
        self.precision = precision
        self.dtype = precision.autocast_dtype  # None: fp32
        enable_tf32_matmuls(precision)
        self.grad_clip = float(grad_clip)
        self.overlap_communication = overlap_communication
        self.gemini_placement_policy = gemini_placement_policy
        self.gemini_offload_optim_frac = gemini_offload_optim_frac
        self.gemini_offload_param_frac = gemini_offload_param_frac
        self.ddp_kwargs = dict(ddp_kwargs or {})
        self.zero_kwargs = dict(zero_kwargs or {})
        self.gemini_kwargs = dict(gemini_kwargs or {})

        # Validate the node size before any group exists: every rank raises the same error.
        self.node_size = None
        if group_zero:
            self.node_size = default_node_size(self.world_size) if node_size is None else node_size
            if not isinstance(self.node_size, int) or self.node_size < 1 or self.world_size % self.node_size:
                raise ValueError(
                    f"group_zero shards within a node of node_size={self.node_size!r} ranks, which must be a positive "
                    f"divisor of the world size {self.world_size}; pass node_size=<ranks per node>"
                )
        if zero_degree in (1, 2):  # after the argument checks, so a wrong argument is reported first
            _zero.check_zero_device()

        mesh = build_data_seq_mesh(sp_size)
        self.sp_size, self.dp_size = mesh.sp_size, mesh.dp_size
        self.sp_rank, self.dp_rank = mesh.sp_rank, mesh.dp_rank
        self.sp_group, self.dp_group = mesh.sp_group, mesh.dp_group

        # The ranks one copy of the ZeRO state (and the EMA) is sharded over, and those holding
        # replicas of the same shard (grouped ZeRO across nodes; None when there is one copy).
        self.zero_group, self.replica_group = dist.group.WORLD, None
        if group_zero:
            self.zero_group, replica_group = block_groups(self.node_size)
            if self.node_size < self.world_size:
                self.replica_group = replica_group

        self._model: Optional[ModelWrapper] = None
        self._optimizer: Optional[OptimizerWrapper] = None
        self._ema: Optional[ShardedEMA] = None

    # ------------------------------------------------------------------ Plugin interface

    def supported_devices(self) -> List[str]:
        return ["cuda", "cpu"]

    def supported_precisions(self) -> List[str]:
        return [name for name in PRECISION_NAMES if name != "auto"]

    def control_precision(self) -> bool:
        return True

    def control_device(self) -> bool:
        return True

    def control_checkpoint_io(self) -> bool:
        return True

    def support_lora(self) -> bool:
        """LoRA trains with DDP and ZeRO-1/2 (the optimizer, its shards and the EMA hold only the
        adapters); Gemini's chunked parameters are not adapted."""
        return self.zero_degree in (0, 1, 2)

    def enable_lora(self, model: nn.Module, pretrained_dir: Optional[str] = None, lora_config=None,
                    bnb_quantization_config=None) -> nn.Module:
        """``Booster.enable_lora``: inject the adapters of a ``peft.LoraConfig`` into ``model`` in place,
        before boosting; the base is frozen. Build the optimizer from the trainable parameters only."""
        from ..models.lora import apply_lora

        if not self.support_lora():
            raise NotImplementedError(f"LoRA needs zero_degree 0, 1 or 2; this plugin has "
                                      f"zero_degree={self.zero_degree}")
        if isinstance(model, ModelWrapper):
            raise ValueError("enable LoRA before Booster.boost, on the plain nn.Module")
        if pretrained_dir is not None or bnb_quantization_config is not None:
            raise NotImplementedError("OpenDiTPlugin adds new adapters only: load trained adapters with the run's "
                                      "checkpoint (resume_from) instead of pretrained_dir, and no quantization")
        targets = lora_config.target_modules  # None: the model's usual targets (models.capabilities.lora_targets)
        targets = [targets] if isinstance(targets, str) else None if targets is None else sorted(targets)
        apply_lora(model, rank=lora_config.r, alpha=lora_config.lora_alpha, dropout=lora_config.lora_dropout,
                   targets=targets)
        return model

    def support_no_sync(self) -> bool:
        return self.zero_degree in (0, 1)

    def no_sync(self, model: nn.Module, optimizer: OptimizerWrapper) -> Iterator[None]:
        """Skip gradient communication in the enclosed backward passes (DDP and ZeRO-1 only)."""
        if self.zero_degree == 0:
            return model.module.no_sync()
        if self.zero_degree == 1:
            return optimizer.no_sync()
        raise NotImplementedError(
            f"zero_degree={self.zero_degree} has no no_sync: call backward once per micro-batch and step once"
        )

    def get_checkpoint_io(self) -> CheckpointIO:
        if self.zero_degree == 0:
            return DDPCheckpointIO()  # CPU-safe optimizer loading
        if self.zero_degree in (1, 2):
            return ZeroCheckpointIO()
        return GeminiCheckpointIO()

    def configure(
        self,
        model: nn.Module,
        optimizer: Optional[Optimizer] = None,
        criterion: Optional[Callable] = None,
        dataloader: Optional[DataLoader] = None,
        lr_scheduler=None,
    ) -> Tuple[nn.Module, Optional[OptimizerWrapper], Optional[Callable], Optional[DataLoader], object]:
        if isinstance(model, ModelWrapper):
            raise ValueError("the model is already boosted; pass the plain nn.Module to Booster.boost once")
        if optimizer is not None and self._optimizer is not None:
            raise ValueError("this OpenDiTPlugin already trains a model (and owns its EMA); use one plugin per "
                             "trained model")
        if self.precision.fp8 and not has_fp8_linears(model):
            raise ValueError("precision fp8 trains the blocks' Linear layers in float8, and this model has none: call "
                             "opendit_lite.precision.apply_fp8_training(model) before building the optimizer and "
                             "boosting (train.py does), or use precision='bf16'")
        if self.zero_degree == 0:
            model, optimizer = apply_ddp(
                model, optimizer, device=get_accelerator().get_current_device(), dtype=self.dtype,
                max_norm=self.grad_clip, **self.ddp_kwargs,
            )
        elif self.zero_degree in (1, 2):
            model, optimizer = apply_low_level_zero(
                model, optimizer, stage=self.zero_degree, precision=self.precision.dtype_name,
                zero_group=self.zero_group, replica_group=self.replica_group, max_norm=self.grad_clip,
                overlap_communication=self.overlap_communication and torch.cuda.is_available(), **self.zero_kwargs,
            )
        else:
            model, optimizer = apply_gemini(
                model, optimizer, dtype=self.dtype, zero_group=self.zero_group, replica_group=self.replica_group,
                placement_policy=self.gemini_placement_policy, offload_optim_frac=self.gemini_offload_optim_frac,
                offload_param_frac=self.gemini_offload_param_frac, max_norm=self.grad_clip, **self.gemini_kwargs,
            )
        if optimizer is not None:
            self._model, self._optimizer = model, optimizer
        return model, optimizer, criterion, dataloader, lr_scheduler

    def prepare_dataloader(
        self,
        dataset: Dataset,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 1024,
        drop_last: bool = True,
        pin_memory: bool = False,
        num_workers: int = 0,
        distributed_sampler_cls=None,
        **kwargs,
    ) -> DataLoader:
        """A DataLoader of ``batch_size`` samples per rank, sharded over the data-parallel axis only.

        ``batch_size`` is per rank: pass ``global_batch_size // plugin.dp_size``. The sampler
        (``distributed_sampler_cls``, default ``DistributedSampler``, built with ``num_replicas``,
        ``rank``, ``shuffle``, ``seed``, ``drop_last``) gives every rank of an SP group the same
        indices; call ``loader.sampler.set_epoch(epoch)`` each epoch. Worker processes are seeded
        from ``seed + dp_rank`` so random transforms also agree inside an SP group. Randomness
        drawn in the main process (``num_workers=0``) follows the global RNG: seed it per DP rank.
        """
        sampler_cls = distributed_sampler_cls or DistributedSampler
        sampler = sampler_cls(
            dataset, num_replicas=self.dp_size, rank=self.dp_rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        generator = torch.Generator()
        generator.manual_seed(seed + self.dp_rank)  # workers' base seed
        return DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, pin_memory=pin_memory,
            num_workers=num_workers, generator=generator, **kwargs,
        )

    # ------------------------------------------------------------------ optimizer

    def build_optimizer(
        self,
        params: Iterable,
        lr: float,
        weight_decay: float = 0.0,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        fused: Optional[bool] = None,
        fused_ema: bool = False,
    ) -> Optimizer:
        """AdamW for this strategy: torch's (fused by default on CUDA), or Colossal-AI's HybridAdam for Gemini.

        Gemini updates shards that may live on the CPU or the GPU, which only Colossal-AI's Adam
        kernels handle; ``fused`` is ignored there.
        ``fused_ema``: ``opendit_lite.optim.AdamWEMA`` instead (DDP and ZeRO-1/2; ``fused`` is then
        not used), which advances the EMA inside its step over the same tensors it just updated:
        the parameters under DDP, the fp32 master shards under ZeRO.
        """
        if fused_ema:
            if self.zero_degree == 3:
                raise ValueError("fused_ema (AdamW + EMA in one optimizer step) covers zero_degree 0, 1 and 2; "
                                 "Gemini (zero_degree=3) updates its chunks with HybridAdam")
            return AdamWEMA(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        if self.zero_degree == 3:
            from colossalai.nn.optimizer import HybridAdam  # builds its CUDA/CPU kernels on first use

            return HybridAdam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adamw_mode=True)
        fused = torch.cuda.is_available() if fused is None else fused
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)

    # ------------------------------------------------------------------ fp32 master weights

    def master_weight_shards(self, model: ModelWrapper,
                             optimizer: OptimizerWrapper) -> Optional[Dict[str, torch.Tensor]]:
        """This rank's fp32 master shards by parameter name when they are kept apart from the working
        weights (ZeRO-1/2 and Gemini in bf16/fp16), for checkpoints; None for DDP (fp32 weights) and
        fp32 ZeRO (the masters equal the working weights)."""
        if self.zero_degree == 3:
            return _gemini.master_shards(model)
        if self.zero_degree not in (1, 2) or self.dtype is None:
            return None
        return _zero.master_shards(model.unwrap(), optimizer)

    def load_master_weight_shards(self, model: ModelWrapper, optimizer: OptimizerWrapper,
                                  shards: Dict[str, torch.Tensor]) -> None:
        """Put shards from :meth:`master_weight_shards` of the same world size back (after the model
        weights and the optimizer state of the same checkpoint)."""
        if self.zero_degree == 3:
            _gemini.load_master_shards(model, shards)
        else:
            _zero.load_master_shards(model.unwrap(), optimizer, shards)

    # ------------------------------------------------------------------ EMA

    # The EMA's logic is in opendit_lite.ema; the plugin keeps the EMA of the model it boosted and
    # these two entry points, which the Booster snippet of docs/library_api.md and LiteGen users call.

    def create_ema(self, model: ModelWrapper, optimizer: Optional[OptimizerWrapper] = None) -> ShardedEMA:
        """Create the sharded fp32 EMA of ``model`` (boosted by this plugin), equal to its current
        weights (``opendit_lite.ema.create_sharded_ema`` with this plugin's ZeRO partition).

        ``optimizer`` defaults to the one boosted with ``model``; ZeRO and Gemini read their fp32
        master shards from it.
        """
        self._ema = create_sharded_ema(model, optimizer if optimizer is not None else self._optimizer, self)
        return self._ema

    def update_ema(self, model: ModelWrapper, optimizer: Optional[OptimizerWrapper] = None,
                   decay: float = 0.9999, next_decay: Optional[float] = None) -> None:
        """``ema = decay * ema + (1 - decay) * weights`` after ``optimizer.step()``; creates the EMA on
        first use (``opendit_lite.ema.update_sharded_ema``; ``next_decay``: the next update's decay
        when it changes, as under warm-up)."""
        if self._ema is None:
            self.create_ema(model, optimizer)
        elif self._ema.module is not model.unwrap():
            raise ValueError("update_ema got a different model from the one the EMA was created for")
        update_sharded_ema(self._ema, optimizer if optimizer is not None else self._optimizer, decay, next_decay)

    @property
    def ema(self) -> ShardedEMA:
        """The EMA of the boosted model (created from its current weights on first access): its
        ``state_dict(only_rank_0=...)`` gathers the full fp32 EMA with the model's own key names (a
        collective), ``load_state_dict`` takes one saved at any world size or zero_degree, and
        ``numel_local()`` counts the elements this rank holds."""
        if self._ema is None:
            if self._model is None:
                raise ValueError("no EMA yet: boost a model with an optimizer (and call create_ema or update_ema) "
                                 "first")
            self.create_ema(self._model)
        return self._ema
