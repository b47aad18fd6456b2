"""Config -> the training objective: IDDPM or rectified flow from the ``diffusion`` section (image
and video configs alike); ``opendit_lite.diffusion.loss.objective_loss`` is its loss of a batch."""

from ..config import TrainConfig
from ..diffusion import build_scheduler


def build_training_objective(cfg: TrainConfig):
    """IDDPM or rectified flow from the ``diffusion`` section (image and video configs alike)."""
    d = cfg.diffusion
    if d.objective == "rflow":
        return build_scheduler("rflow", num_timesteps=d.diffusion_steps, sample_method=d.timestep_sampling)
    return build_scheduler("iddpm", noise_schedule=d.noise_schedule, learn_sigma=cfg.model.learn_sigma,
                           diffusion_steps=d.diffusion_steps)
