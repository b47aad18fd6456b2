"""Config -> the training objective: IDDPM, rectified flow or v-prediction from the ``diffusion``
section (image and video configs alike; a diffusers family's recipe fills the video section's
unset fields, see ``builders/diffusers_model.py``); ``opendit_lite.diffusion.loss.objective_loss`` is
its loss of a batch."""

from typing import Optional, Sequence

from ..config import TrainConfig
from ..diffusion import build_scheduler
from ..errors import ConfigError
from ..families import Recipe


def objective_for(objective: str, timestep_sampling: str, shift: Optional[float], num_timesteps: int = 1000,
                  noise_schedule: str = "linear", learn_sigma: bool = False,
                  time_range: Sequence[float] = (0.0, 1.0)):
    """The objective ``objective`` ("rflow", "vpred" or "iddpm") with its settings; ``time_range``: the
    rectified-flow times trained on (one expert of Wan 2.2's pair: its own noise range)."""
    if objective == "rflow":
        return build_scheduler("rflow", num_timesteps=num_timesteps, sample_method=timestep_sampling,
                               shift=1.0 if shift is None else shift, time_range=tuple(time_range))
    if tuple(time_range) != (0.0, 1.0):
        raise ConfigError(f"training one expert on its noise range {tuple(time_range)} needs rectified flow "
                          f"(diffusion.objective=rflow), the objective of the models with experts; got {objective}.")
    if objective == "iddpm" and shift not in (None, 1.0):
        raise ConfigError(f"diffusion.shift={shift} applies to rectified flow (its time shift) and v-prediction "
                          f"(its SNR shift), not to iddpm: remove it.")
    if objective == "vpred":
        if timestep_sampling != "uniform":
            raise ConfigError(f"diffusion.timestep_sampling={timestep_sampling!r}: v-prediction draws its integer "
                              f"timesteps uniformly; set diffusion.timestep_sampling=uniform.")
        return build_scheduler("vpred", num_timesteps=num_timesteps, snr_shift=1.0 if shift is None else shift)
    return build_scheduler("iddpm", noise_schedule=noise_schedule, learn_sigma=learn_sigma,
                           diffusion_steps=num_timesteps)


def objective_for_recipe(recipe: Recipe, num_timesteps: int = 1000):
    """A diffusers family's published objective (``opendit_lite.families.Recipe``)."""
    return objective_for(recipe.objective, recipe.timestep_sampling, recipe.shift, num_timesteps)


def build_training_objective(cfg: TrainConfig, time_range: Sequence[float] = (0.0, 1.0)):
    """IDDPM, rectified flow or v-prediction from the ``diffusion`` section (rectified-flow times drawn
    within ``time_range``)."""
    d = cfg.diffusion
    return objective_for(d.objective, d.timestep_sampling, d.shift, d.diffusion_steps, d.noise_schedule,
                         cfg.model.learn_sigma, time_range=time_range)
