"""Discrete-time Gaussian diffusion with DiT's training objective and DDPM / DDIM samplers.

Notation (DDPM, Ho et al. 2020; Improved DDPM, Nichol & Dhariwal 2021):

* forward process ``q(x_t | x_{t-1}) = N(sqrt(1 - beta_t) x_{t-1}, beta_t)``, so with
  ``alpha_t = 1 - beta_t`` and ``alpha_bar_t = prod_{s <= t} alpha_s``:
  ``x_t = sqrt(alpha_bar_t) x_0 + sqrt(1 - alpha_bar_t) eps``;
* posterior ``q(x_{t-1} | x_t, x_0) = N(c1_t x_0 + c2_t x_t, beta_tilde_t)`` with
  ``beta_tilde_t = beta_t (1 - alpha_bar_{t-1}) / (1 - alpha_bar_t)``;
* reverse process ``p(x_{t-1} | x_t) = N(mu(x_t), Sigma(x_t))``: the model predicts ``eps`` (or
  ``x_0``), from which ``mu`` is the posterior mean at the predicted ``x_0``; ``Sigma`` is fixed or
  learned (``LEARNED_RANGE``: a second block of output channels ``v`` interpolates the log-variance
  between ``log beta_tilde_t`` (``v = -1``) and ``log beta_t`` (``v = 1``)).

Timesteps ``t`` are integer indices in ``[0, num_timesteps)``; index 0 is the least noisy step.

Training (DiT's default, ``LossType.MSE`` with learned variance) minimises
``mse(eps, eps_pred) + vb``, where ``vb`` is one term of the variational bound in bits per dimension,
computed with the predicted mean detached: the MSE alone trains the mean, and the bound trains only
the variance (Improved DDPM's hybrid objective). ``RESCALED_MSE`` multiplies ``vb`` by
``num_timesteps / 1000``: one sampled term estimates the whole bound divided by ``num_timesteps``,
and Improved DDPM weighs the whole bound by 1/1000. With 1000 steps the two are identical.

All schedule tables are computed once in float64 (public attributes, e.g. ``alphas_cumprod``) and
looked up as float32, as DiT does, so the arithmetic matches DiT's numbers.
"""

import enum
import math
from typing import Callable, Dict, Iterator, Optional, Sequence

import torch

from .likelihood import discretized_gaussian_log_likelihood, mean_flat, normal_kl
from .sampling_utils import Device, initial_noise, progress_bar, resolve_device, standard_normal_like

ModelFn = Callable[..., torch.Tensor]


class ModelMeanType(enum.Enum):
    """What the model's (first block of) output channels predict."""

    START_X = enum.auto()  # the clean sample x_0
    EPSILON = enum.auto()  # the noise that was added


class ModelVarType(enum.Enum):
    """How the reverse-process variance is chosen."""

    LEARNED = enum.auto()  # second output block is the log-variance itself
    FIXED_SMALL = enum.auto()  # beta_tilde_t, the posterior variance (the lower bound)
    FIXED_LARGE = enum.auto()  # beta_t (the upper bound); beta_tilde_1 at t = 0, where beta_0 is too small
    LEARNED_RANGE = enum.auto()  # second output block v in [-1, 1] interpolates log beta_tilde_t .. log beta_t


class LossType(enum.Enum):
    """Training objective (see the module docstring)."""

    MSE = enum.auto()  # mse on the prediction (+ vb when the variance is learned)
    RESCALED_MSE = enum.auto()  # as MSE with vb scaled by num_timesteps / 1000
    KL = enum.auto()  # the variational bound term alone
    RESCALED_KL = enum.auto()  # the bound term times num_timesteps (an estimate of the whole bound)

    def is_vb(self) -> bool:
        return self in (LossType.KL, LossType.RESCALED_KL)


_LEARNED_VARIANCES = (ModelVarType.LEARNED, ModelVarType.LEARNED_RANGE)


def _final_sample(steps: Iterator[Dict[str, torch.Tensor]]) -> torch.Tensor:
    """The last ``"sample"`` of a progressive sampling loop (x_0)."""
    sample = None
    for out in steps:
        sample = out["sample"]
    return sample


class GaussianDiffusion:
    """A Gaussian diffusion over ``len(betas)`` steps: forward noising, training losses and samplers.

    Every ``model`` argument is any callable ``model(x_t, t, **model_kwargs)`` returning a tensor shaped
    like ``x_t`` (``[B, C, ...]``), or ``[B, 2C, ...]`` when the variance is learned.
    """

    def __init__(
        self,
        *,
        betas: Sequence[float],
        model_mean_type: ModelMeanType,
        model_var_type: ModelVarType,
        loss_type: LossType,
    ):
        betas = torch.as_tensor(betas, dtype=torch.float64)
        if betas.dim() != 1 or len(betas) < 2:
            raise ValueError(f"betas must be a 1-D sequence of at least 2 values, got shape {tuple(betas.shape)}")
        if not bool(((betas > 0) & (betas <= 1)).all()):
            raise ValueError(
                f"betas must lie in (0, 1], got min {betas.min().item():.3g} and max {betas.max().item():.3g}; "
                "a linear schedule with very few steps overshoots 1: use more steps or respace instead"
            )
        self.model_mean_type = model_mean_type
        self.model_var_type = model_var_type
        self.loss_type = loss_type
        self.num_timesteps = len(betas)

        self.betas = betas
        self.log_betas = torch.log(betas)
        alphas = 1.0 - betas
        self.alphas_cumprod = torch.cumprod(alphas, dim=0)
        self.alphas_cumprod_prev = torch.cat([torch.ones(1, dtype=torch.float64), self.alphas_cumprod[:-1]])

        # q(x_t | x_0) and its inversion x_0 = x_t / sqrt(abar) - sqrt(1 / abar - 1) eps
        self.sqrt_alphas_cumprod = torch.sqrt(self.alphas_cumprod)
        self.sqrt_one_minus_alphas_cumprod = torch.sqrt(1.0 - self.alphas_cumprod)
        self.log_one_minus_alphas_cumprod = torch.log(1.0 - self.alphas_cumprod)
        self.sqrt_recip_alphas_cumprod = torch.sqrt(1.0 / self.alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = torch.sqrt(1.0 / self.alphas_cumprod - 1.0)

        # q(x_{t-1} | x_t, x_0)
        one_minus_ac = 1.0 - self.alphas_cumprod
        self.posterior_variance = betas * (1.0 - self.alphas_cumprod_prev) / one_minus_ac
        # beta_tilde_0 is exactly 0, whose log is -inf: use beta_tilde_1 there (only the t = 0 likelihood
        # term and the LEARNED_RANGE lower end read it).
        self.posterior_log_variance_clipped = torch.log(
            torch.cat([self.posterior_variance[1:2], self.posterior_variance[1:]])
        )
        self.posterior_mean_coef1 = betas * torch.sqrt(self.alphas_cumprod_prev) / one_minus_ac
        self.posterior_mean_coef2 = (1.0 - self.alphas_cumprod_prev) * torch.sqrt(alphas) / one_minus_ac
        self.fixed_large_variance = torch.cat([self.posterior_variance[1:2], betas[1:]])

        self._table_cache: Dict[tuple, torch.Tensor] = {}

    # ------------------------------------------------------------------ table look-up

    def _table(self, name: str, device: torch.device) -> torch.Tensor:
        """Attribute ``name`` on ``device`` (float tables as float32), copied there once and cached."""
        key = (name, device)
        table = self._table_cache.get(key)
        if table is None:
            table = getattr(self, name)
            table = table.to(device=device, dtype=torch.float32 if table.is_floating_point() else table.dtype)
            self._table_cache[key] = table
        return table

    def _extract(self, name: str, t: torch.Tensor, ndim: int) -> torch.Tensor:
        """Values of table ``name`` at timesteps t [B], shaped [B, 1, ..., 1] to broadcast over ndim dims."""
        return self._table(name, t.device)[t].view(-1, *([1] * (ndim - 1)))

    def _model_timesteps(self, t: torch.Tensor) -> torch.Tensor:
        """The timesteps the model is called with; a respaced diffusion maps them back to the original ones."""
        return t

    # ------------------------------------------------------------------ forward process

    def q_mean_variance(self, x_start: torch.Tensor, t: torch.Tensor):
        """Mean, variance and log-variance of q(x_t | x_0); the latter two are [B, 1, ...]."""
        mean = self._extract("sqrt_alphas_cumprod", t, x_start.dim()) * x_start
        variance = 1.0 - self._extract("alphas_cumprod", t, x_start.dim())
        log_variance = self._extract("log_one_minus_alphas_cumprod", t, x_start.dim())
        return mean, variance, log_variance

    def q_sample(self, x_start: torch.Tensor, t: torch.Tensor, noise: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Draw x_t ~ q(x_t | x_0): ``sqrt(abar_t) x_0 + sqrt(1 - abar_t) noise``."""
        if noise is None:
            noise = torch.randn_like(x_start)
        elif noise.shape != x_start.shape:
            raise ValueError(f"noise shape {tuple(noise.shape)} must equal x_start shape {tuple(x_start.shape)}")
        ndim = x_start.dim()
        return (
            self._extract("sqrt_alphas_cumprod", t, ndim) * x_start
            + self._extract("sqrt_one_minus_alphas_cumprod", t, ndim) * noise
        )

    def q_posterior_mean_variance(self, x_start: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor):
        """Mean, variance and clipped log-variance of q(x_{t-1} | x_t, x_0); the latter two are [B, 1, ...]."""
        ndim = x_t.dim()
        mean = self._extract("posterior_mean_coef1", t, ndim) * x_start + self._extract(
            "posterior_mean_coef2", t, ndim
        ) * x_t
        variance = self._extract("posterior_variance", t, ndim)
        log_variance = self._extract("posterior_log_variance_clipped", t, ndim)
        return mean, variance, log_variance

    # ------------------------------------------------------------------ reverse process

    def _predict_xstart_from_eps(self, x_t: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        ndim = x_t.dim()
        return (
            self._extract("sqrt_recip_alphas_cumprod", t, ndim) * x_t
            - self._extract("sqrt_recipm1_alphas_cumprod", t, ndim) * eps
        )

    def _predict_eps_from_xstart(self, x_t: torch.Tensor, t: torch.Tensor, pred_xstart: torch.Tensor) -> torch.Tensor:
        ndim = x_t.dim()
        return (self._extract("sqrt_recip_alphas_cumprod", t, ndim) * x_t - pred_xstart) / self._extract(
            "sqrt_recipm1_alphas_cumprod", t, ndim
        )

    def _split_output(self, model_output: torch.Tensor, x: torch.Tensor):
        """[B, C or 2C, ...] model output -> (prediction [B, C, ...], variance values [B, C, ...] or None)."""
        channels = x.shape[1]
        learned = self.model_var_type in _LEARNED_VARIANCES
        expected = 2 * channels if learned else channels
        if model_output.shape[0] != x.shape[0] or model_output.shape[1] != expected:
            what = f"2 x {channels} channels (prediction then variance)" if learned else f"{channels} channels"
            raise ValueError(
                f"model output has shape {tuple(model_output.shape)} for input {tuple(x.shape)}; "
                f"{self.model_var_type.name} needs {what} per sample: check the model's out_channels / learn_sigma"
            )
        if not learned:
            return model_output, None
        prediction, var_values = model_output.split(channels, dim=1)
        return prediction, var_values

    def _p_mean_variance_from_output(
        self,
        model_output: torch.Tensor,
        x: torch.Tensor,
        t: torch.Tensor,
        clip_denoised: bool,
        denoised_fn: Optional[Callable[[torch.Tensor], torch.Tensor]],
    ) -> Dict[str, torch.Tensor]:
        prediction, var_values = self._split_output(model_output, x)
        ndim = x.dim()
        if self.model_var_type == ModelVarType.LEARNED:
            log_variance = var_values
        elif self.model_var_type == ModelVarType.LEARNED_RANGE:
            min_log = self._extract("posterior_log_variance_clipped", t, ndim)
            max_log = self._extract("log_betas", t, ndim)
            frac = (var_values + 1) / 2  # v in [-1, 1] -> [0, 1]
            log_variance = frac * max_log + (1 - frac) * min_log
        elif self.model_var_type == ModelVarType.FIXED_LARGE:
            log_variance = torch.log(self._extract("fixed_large_variance", t, ndim))
        else:
            log_variance = self._extract("posterior_log_variance_clipped", t, ndim)

        if self.model_mean_type == ModelMeanType.START_X:
            pred_xstart = prediction
        else:
            pred_xstart = self._predict_xstart_from_eps(x, t, prediction)
        if denoised_fn is not None:
            pred_xstart = denoised_fn(pred_xstart)
        if clip_denoised:
            pred_xstart = pred_xstart.clamp(-1, 1)
        mean, _, _ = self.q_posterior_mean_variance(pred_xstart, x, t)
        return {
            "mean": mean,
            "variance": torch.exp(log_variance),
            "log_variance": log_variance,
            "pred_xstart": pred_xstart,
        }

    def p_mean_variance(
        self,
        model: ModelFn,
        x: torch.Tensor,
        t: torch.Tensor,
        clip_denoised: bool = True,
        denoised_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        model_kwargs: Optional[dict] = None,
    ) -> Dict[str, torch.Tensor]:
        """Run the model at (x_t, t) and return p(x_{t-1} | x_t): mean, variance, log_variance, pred_xstart.

        ``clip_denoised`` clamps the predicted x_0 to [-1, 1] (right for pixels, wrong for latents, which
        is why DiT's sampling script turns it off); ``denoised_fn`` post-processes it before clamping.
        Variances may be [B, 1, ...] (fixed) and broadcast against x.
        """
        model_output = model(x, self._model_timesteps(t), **(model_kwargs or {}))
        return self._p_mean_variance_from_output(model_output, x, t, clip_denoised, denoised_fn)

    def p_sample(
        self,
        model: ModelFn,
        x: torch.Tensor,
        t: torch.Tensor,
        clip_denoised: bool = True,
        denoised_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        model_kwargs: Optional[dict] = None,
        generator: Optional[torch.Generator] = None,
    ) -> Dict[str, torch.Tensor]:
        """One ancestral (DDPM) step x_t -> x_{t-1}; no noise is added at t == 0."""
        out = self.p_mean_variance(model, x, t, clip_denoised, denoised_fn, model_kwargs)
        # Drawn at every step, t == 0 included, so a seeded run follows the same random stream as DiT's.
        noise = standard_normal_like(x, generator)
        nonzero = (t != 0).to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
        sample = out["mean"] + nonzero * torch.exp(0.5 * out["log_variance"]) * noise
        return {"sample": sample, "pred_xstart": out["pred_xstart"]}

    def ddim_sample(
        self,
        model: ModelFn,
        x: torch.Tensor,
        t: torch.Tensor,
        clip_denoised: bool = True,
        denoised_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        model_kwargs: Optional[dict] = None,
        eta: float = 0.0,
        generator: Optional[torch.Generator] = None,
    ) -> Dict[str, torch.Tensor]:
        """One DDIM step x_t -> x_{t-1} (Song et al. 2021); eta = 0 is deterministic, eta = 1 is DDPM-like.

        The step keeps the predicted x_0 and re-noises it to level t-1 with the model's own eps plus
        fresh noise of variance ``sigma^2 = eta^2 beta_tilde_t`` (computed from alpha_bar, so it stays
        right on a respaced schedule). A learned variance is ignored.
        """
        out = self.p_mean_variance(model, x, t, clip_denoised, denoised_fn, model_kwargs)
        eps = self._predict_eps_from_xstart(x, t, out["pred_xstart"])
        alpha_bar = self._extract("alphas_cumprod", t, x.dim())
        alpha_bar_prev = self._extract("alphas_cumprod_prev", t, x.dim())
        sigma = eta * torch.sqrt((1 - alpha_bar_prev) / (1 - alpha_bar)) * torch.sqrt(1 - alpha_bar / alpha_bar_prev)
        noise = standard_normal_like(x, generator)
        mean = out["pred_xstart"] * torch.sqrt(alpha_bar_prev) + torch.sqrt(1 - alpha_bar_prev - sigma**2) * eps
        nonzero = (t != 0).to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
        return {"sample": mean + nonzero * sigma * noise, "pred_xstart": out["pred_xstart"]}

    # ------------------------------------------------------------------ sampling loops

    def _sample_loop_progressive(
        self,
        step: Callable[..., Dict[str, torch.Tensor]],
        model: ModelFn,
        shape: Optional[Sequence[int]],
        noise: Optional[torch.Tensor],
        device: Device,
        progress: bool,
        generator: Optional[torch.Generator],
        **step_kwargs,
    ) -> Iterator[Dict[str, torch.Tensor]]:
        device = resolve_device(model, noise, device, generator)
        x = initial_noise(shape, noise, device, generator)
        for i in progress_bar(range(self.num_timesteps - 1, -1, -1), progress):
            t = torch.full((x.shape[0],), i, device=device, dtype=torch.long)
            with torch.no_grad():
                out = step(model, x, t, generator=generator, **step_kwargs)
            yield out
            x = out["sample"]

    def p_sample_loop_progressive(
        self,
        model: ModelFn,
        shape: Optional[Sequence[int]] = None,
        noise: Optional[torch.Tensor] = None,
        clip_denoised: bool = True,
        denoised_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        model_kwargs: Optional[dict] = None,
        device: Device = None,
        progress: bool = False,
        generator: Optional[torch.Generator] = None,
    ) -> Iterator[Dict[str, torch.Tensor]]:
        """Yield each DDPM step's ``{"sample", "pred_xstart"}`` from t = T-1 down to 0 (for visualising)."""
        return self._sample_loop_progressive(
            self.p_sample, model, shape, noise, device, progress, generator,
            clip_denoised=clip_denoised, denoised_fn=denoised_fn, model_kwargs=model_kwargs,
        )

    def p_sample_loop(
        self,
        model: ModelFn,
        shape: Optional[Sequence[int]] = None,
        noise: Optional[torch.Tensor] = None,
        clip_denoised: bool = True,
        denoised_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        model_kwargs: Optional[dict] = None,
        device: Device = None,
        progress: bool = False,
        generator: Optional[torch.Generator] = None,
    ) -> torch.Tensor:
        """Ancestral sampling over all ``num_timesteps`` steps; returns x_0 [shape].

        Starts from ``noise`` if given, else from a standard normal of ``shape`` drawn from
        ``generator``, which also draws every step's noise: a fixed generator seed (or fixed noise and
        seed) gives the same samples. For classifier-free guidance pass a doubled batch and a guided
        model function (``cfg_model_fn`` or DiT's ``forward_with_cfg``), as DiT's sampling script does.
        """
        return _final_sample(self.p_sample_loop_progressive(
            model, shape, noise, clip_denoised=clip_denoised, denoised_fn=denoised_fn,
            model_kwargs=model_kwargs, device=device, progress=progress, generator=generator,
        ))

    def ddim_sample_loop_progressive(
        self,
        model: ModelFn,
        shape: Optional[Sequence[int]] = None,
        noise: Optional[torch.Tensor] = None,
        clip_denoised: bool = True,
        denoised_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        model_kwargs: Optional[dict] = None,
        device: Device = None,
        progress: bool = False,
        eta: float = 0.0,
        generator: Optional[torch.Generator] = None,
    ) -> Iterator[Dict[str, torch.Tensor]]:
        """Yield each DDIM step's ``{"sample", "pred_xstart"}`` from t = T-1 down to 0."""
        return self._sample_loop_progressive(
            self.ddim_sample, model, shape, noise, device, progress, generator,
            clip_denoised=clip_denoised, denoised_fn=denoised_fn, model_kwargs=model_kwargs, eta=eta,
        )

    def ddim_sample_loop(
        self,
        model: ModelFn,
        shape: Optional[Sequence[int]] = None,
        noise: Optional[torch.Tensor] = None,
        clip_denoised: bool = True,
        denoised_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        model_kwargs: Optional[dict] = None,
        device: Device = None,
        progress: bool = False,
        eta: float = 0.0,
        generator: Optional[torch.Generator] = None,
    ) -> torch.Tensor:
        """DDIM sampling over all ``num_timesteps`` steps (respace first, e.g. "ddim50", to take fewer)."""
        return _final_sample(self.ddim_sample_loop_progressive(
            model, shape, noise, clip_denoised=clip_denoised, denoised_fn=denoised_fn,
            model_kwargs=model_kwargs, device=device, progress=progress, eta=eta, generator=generator,
        ))

    # ------------------------------------------------------------------ training

    def _vb_terms_bpd(
        self, model_output: torch.Tensor, x_start: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """One variational-bound term per sample [B], in bits per dimension.

        KL(q(x_{t-1} | x_t, x_0) || p(x_{t-1} | x_t)) for t > 0, and the discretised negative
        log-likelihood of x_0 under p(x_0 | x_1) at t == 0. x_0 is not clipped (latents are unbounded).
        """
        true_mean, _, true_log_variance = self.q_posterior_mean_variance(x_start, x_t, t)
        out = self._p_mean_variance_from_output(model_output, x_t, t, clip_denoised=False, denoised_fn=None)
        kl = mean_flat(normal_kl(true_mean, true_log_variance, out["mean"], out["log_variance"])) / math.log(2.0)
        decoder_nll = -mean_flat(
            discretized_gaussian_log_likelihood(x_start, means=out["mean"], log_scales=0.5 * out["log_variance"])
        ) / math.log(2.0)
        return torch.where(t == 0, decoder_nll, kl)

    def training_losses(
        self,
        model: ModelFn,
        x_start: torch.Tensor,
        t: torch.Tensor,
        model_kwargs: Optional[dict] = None,
        noise: Optional[torch.Tensor] = None,
    ) -> Dict[str, torch.Tensor]:
        """Per-sample losses for x_start [B, C, ...] noised to integer timesteps t [B].

        Returns ``{"loss", "mse", "vb"}`` (each [B]) for the MSE loss types, with ``loss = mse + vb``;
        ``vb`` is zero when the variance is fixed (there is nothing for the bound to train). For the
        KL loss types it returns ``{"loss", "vb"}`` with ``loss = vb``. Reduce with ``.mean()``.
        """
        if noise is None:
            noise = torch.randn_like(x_start)
        x_t = self.q_sample(x_start, t, noise=noise)
        model_output = model(x_t, self._model_timesteps(t), **(model_kwargs or {}))

        if self.loss_type.is_vb():
            vb = self._vb_terms_bpd(model_output, x_start, x_t, t)
            if self.loss_type == LossType.RESCALED_KL:
                vb = vb * self.num_timesteps
            return {"loss": vb, "vb": vb}

        prediction, var_values = self._split_output(model_output, x_t)
        target = x_start if self.model_mean_type == ModelMeanType.START_X else noise
        mse = mean_flat((target - prediction) ** 2)
        if var_values is None:
            vb = torch.zeros_like(mse)
        else:
            # The bound sees a detached prediction: its gradient reaches only the variance channels.
            frozen_output = torch.cat([prediction.detach(), var_values], dim=1)
            vb = self._vb_terms_bpd(frozen_output, x_start, x_t, t)
            if self.loss_type == LossType.RESCALED_MSE:
                vb = vb * (self.num_timesteps / 1000.0)
        return {"loss": mse + vb, "mse": mse, "vb": vb}
