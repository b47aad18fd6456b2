"""``create_diffusion``: the Gaussian diffusion DiT trains and samples with, with DiT's signature.

``create_diffusion(timestep_respacing="")`` is the 1000-step training diffusion (linear schedule,
epsilon prediction, learned variance in range, hybrid MSE + VLB loss); ``create_diffusion("250")``
or ``create_diffusion("ddim50")`` is a respaced one for sampling from the same model.
"""

from typing import Optional

from .gaussian_diffusion import LossType, ModelMeanType, ModelVarType
from .registry import register_scheduler
from .respace import SectionCounts, SpacedDiffusion, space_timesteps
from .schedules import get_named_beta_schedule


@register_scheduler("iddpm")
def create_diffusion(
    timestep_respacing: Optional[SectionCounts] = None,
    noise_schedule: str = "linear",
    use_kl: bool = False,
    sigma_small: bool = False,
    predict_xstart: bool = False,
    learn_sigma: bool = True,
    rescale_learned_sigmas: bool = False,
    diffusion_steps: int = 1000,
) -> SpacedDiffusion:
    """A (respaced) Gaussian diffusion configured the way DiT's ``create_diffusion`` does it.

    Args:
        timestep_respacing: which timesteps to keep (see ``space_timesteps``); ``None`` or ``""``
            keeps all ``diffusion_steps`` (training).
        noise_schedule: "linear" (DiT) or "cosine" (Improved DDPM).
        use_kl: train on the rescaled variational bound alone (``LossType.RESCALED_KL``).
        sigma_small: with a fixed variance, use beta_tilde_t instead of beta_t.
        predict_xstart: the model predicts x_0 instead of the noise.
        learn_sigma: the model outputs 2x the input channels, the second half setting the variance.
        rescale_learned_sigmas: scale the VLB term by ``diffusion_steps / 1000`` (``RESCALED_MSE``).
        diffusion_steps: length of the original (training) process.
    """
    if use_kl:
        loss_type = LossType.RESCALED_KL
    elif rescale_learned_sigmas:
        loss_type = LossType.RESCALED_MSE
    else:
        loss_type = LossType.MSE
    if learn_sigma:
        var_type = ModelVarType.LEARNED_RANGE
    else:
        var_type = ModelVarType.FIXED_SMALL if sigma_small else ModelVarType.FIXED_LARGE
    if timestep_respacing is None or timestep_respacing == "":
        timestep_respacing = [diffusion_steps]
    return SpacedDiffusion(
        use_timesteps=space_timesteps(diffusion_steps, timestep_respacing),
        betas=get_named_beta_schedule(noise_schedule, diffusion_steps),
        model_mean_type=ModelMeanType.START_X if predict_xstart else ModelMeanType.EPSILON,
        model_var_type=var_type,
        loss_type=loss_type,
    )
