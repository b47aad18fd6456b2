"""Config -> the training objective: IDDPM, rectified flow or v-prediction from the ``diffusion``
section (image and video configs alike; a diffusers family's recipe fills the video section's
unset fields, see ``builders/diffusers_model.py``); ``opendit_lite.diffusion.loss.objective_loss`` is
its loss of a batch."""

from typing import Optional

from ..config import TrainConfig
from ..diffusion import build_scheduler
from ..errors import ConfigError
from ..families import Recipe


def objective_for(objective: str, timestep_sampling: str, shift: Optional[float], num_timesteps: int = 1000,
                  noise_schedule: str = "linear", learn_sigma: bool = False):
    """The objective ``objective`` ("rflow", "vpred" or "iddpm") with its settings."""
    if objective == "rflow":
        return build_scheduler("rflow", num_timesteps=num_timesteps, sample_method=timestep_sampling,
                               shift=1.0 if shift is None else shift)
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


def build_training_objective(cfg: TrainConfig):
    """IDDPM, rectified flow or v-prediction from the ``diffusion`` section."""
    d = cfg.diffusion
    return objective_for(d.objective, d.timestep_sampling, d.shift, d.diffusion_steps, d.noise_schedule,
                         cfg.model.learn_sigma)
