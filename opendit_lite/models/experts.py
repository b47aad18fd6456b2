"""Two denoisers that split the noise range between them, as Wan 2.2 A14B's experts do: its pipeline
(``WanPipeline.__call__``) runs ``transformer`` for the steps whose timestep is at or above
``boundary_ratio x num_train_timesteps`` (the high-noise expert) and ``transformer_2`` below it (the
low-noise expert). ``NoiseExperts`` holds both as one module, so that everything built for one model
(the booster's DP/ZeRO wrapping, one optimizer over both experts' trainable weights, the sharded
EMA, checkpoints and their resume) covers the two, and its forward sends each sample of a batch to
the expert whose range holds the sample's timestep: the same rule as the pipeline, per sample.

    model = NoiseExperts(transformer, transformer_2, boundary=0.875 * 1000)
    out = model(hidden_states=x, timestep=t, encoder_hidden_states=y, return_dict=False)[0]

A batch whose samples fall on both sides runs each expert on its sub-batch. An expert that gets no
sample still takes part in the backward: its trainable weights are added to the output times zero,
so they get a zero gradient. Every rank then produces a gradient for every trainable weight in every
step, which DDP (no ``find_unused_parameters``), ZeRO's bucketed reduce-scatter and Gemini all need
(their collectives must line up across ranks whose samples fall differently); one process behaves
the same, so a run does not depend on its rank count. A zero gradient still lets AdamW move a weight
by its momentum, as it would for any step whose samples did not involve it.

A run may also train one expert alone (``model.expert``: ``high_noise`` or ``low_noise``): it is then
the plain transformer, trained on its own noise range only (``expert_time_range``).
"""

from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn

# model.expert -> the pipeline components it trains
EXPERT_COMPONENTS: Dict[str, Tuple[str, ...]] = {
    "both": ("transformer", "transformer_2"),
    "high_noise": ("transformer",),
    "low_noise": ("transformer_2",),
}


def expert_components(expert: Optional[str]) -> Tuple[str, ...]:
    """The pipeline components a run trains: ``model.expert`` resolved (None: a one-transformer model)."""
    return ("transformer",) if expert is None else EXPERT_COMPONENTS[expert]


def runs_high_noise(timestep, boundary: float):
    """Whether the high-noise expert (``transformer``) denoises at ``timestep`` (a number, or a tensor of
    them: a bool tensor): at or above ``boundary``, WanPipeline's rule. The one statement of it: the
    training model (``NoiseExperts``) and the tests that compare with the pipeline route by it."""
    return timestep >= boundary


def expert_time_range(expert: str, boundary_ratio: float) -> Tuple[float, float]:
    """The flow times [lo, hi) that ``expert`` denoises in the pipeline: [boundary_ratio, 1] for the
    high-noise expert (``runs_high_noise``: time x num_train_timesteps >= the boundary), [0,
    boundary_ratio) for the low-noise one, everything for both."""
    return {"both": (0.0, 1.0), "high_noise": (boundary_ratio, 1.0), "low_noise": (0.0, boundary_ratio)}[expert]


class NoiseExperts(nn.Module):
    """``transformer`` for timesteps >= ``boundary``, ``transformer_2`` below it (see the module docstring).
    The two take the same keywords; ``config`` is the first's (the adapters read the architecture)."""

    def __init__(self, transformer: nn.Module, transformer_2: nn.Module, boundary: float):
        super().__init__()
        self.transformer = transformer
        self.transformer_2 = transformer_2
        self.boundary = float(boundary)

    @property
    def config(self):
        return self.transformer.config

    def experts(self) -> Tuple[Tuple[str, nn.Module], ...]:
        """(component name, expert) for both, the high-noise one first."""
        return ("transformer", self.transformer), ("transformer_2", self.transformer_2)

    def sequence_parallel_networks(self) -> Tuple[Tuple[str, nn.Module], ...]:
        """The networks sequence parallelism converts, each as if it were the model: both experts (one
        architecture: ``sp_mode=auto`` decides from the first)."""
        return self.experts()

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor, **kwargs):
        """hidden_states [B, ...], timestep [B], the other keywords as the experts take them (tensors
        whose first dimension is B are split with the batch) -> what the experts return, for the
        whole batch in its order."""
        B = hidden_states.shape[0]
        if timestep.dim() == 0:
            timestep = timestep.expand(B)
        if timestep.shape != (B,):
            raise ValueError(f"NoiseExperts routes each sample by its one timestep: timestep must be [B] = "
                             f"[{B}], got {tuple(timestep.shape)} (per-token timesteps have no single expert)")
        high = runs_high_noise(timestep, self.boundary)                             # [B] bool
        outputs, order, touch = [], [], None
        for take, (_, expert) in zip((high, ~high), self.experts()):
            index = take.nonzero().flatten()                                        # [b] samples of this expert
            if index.numel() == 0:
                # No sample here: a zero gradient for its trainable weights (module docstring).
                if torch.is_grad_enabled():
                    zero = sum(p.sum() for p in expert.parameters() if p.requires_grad) * 0.0
                    touch = zero if touch is None else touch + zero
                continue
            sub = {k: v.index_select(0, index) if torch.is_tensor(v) and v.dim() and v.shape[0] == B else v
                   for k, v in kwargs.items()}
            out = expert(hidden_states=hidden_states.index_select(0, index), timestep=timestep.index_select(0, index),
                         **sub)
            outputs.append(out)
            order.append(index)
        samples = [o[0] if isinstance(o, tuple) else o.sample for o in outputs]   # each [b, ...]
        inverse = torch.argsort(torch.cat(order))                                  # [B] back to the batch's order
        sample = torch.cat(samples).index_select(0, inverse)                       # [B, ...]
        if touch is not None:
            sample = sample + touch.to(sample.dtype)
        return (sample,) if isinstance(outputs[0], tuple) else type(outputs[0])(sample=sample)
