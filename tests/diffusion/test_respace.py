import pytest
import torch

from opendit_lite.diffusion import (
    LossType,
    ModelMeanType,
    ModelVarType,
    SpacedDiffusion,
    create_diffusion,
    get_named_beta_schedule,
    space_timesteps,
)


def test_ddim_stride_rule():
    steps = space_timesteps(1000, "ddim25")
    assert sorted(steps) == list(range(0, 1000, 40))  # smallest stride giving exactly 25 steps
    assert sorted(space_timesteps(1000, "ddim50")) == list(range(0, 1000, 20))
    assert sorted(space_timesteps(1000, "ddim30")) == list(range(0, 1000, 34))  # ceil(1000 / 34) == 30


def test_ddim_count_without_an_integer_stride_is_an_error():
    with pytest.raises(ValueError, match="ddim60"):
        space_timesteps(100, "ddim60")  # strides 1 and 2 give 100 and 50 steps


def test_even_spacing_keeps_both_ends():
    steps = sorted(space_timesteps(1000, "250"))
    assert len(steps) == 250 and steps[0] == 0 and steps[-1] == 999
    assert space_timesteps(1000, 250) == space_timesteps(1000, [250]) == set(steps)
    assert space_timesteps(10, "4") == {0, 3, 6, 9}
    assert space_timesteps(1000, "1000") == set(range(1000))


def test_sections():
    # 10 steps in 3 sections of 4, 3, 3: first gets 2 steps {0, 3}, second 3 steps {4, 5, 6}, third 1 {7}
    assert space_timesteps(10, "2,3,1") == {0, 3, 4, 5, 6, 7}
    assert space_timesteps(10, [2, 3, 1]) == {0, 3, 4, 5, 6, 7}


def test_position_is_accumulated_as_in_iddpm():
    # 21 of 1000 steps: at k = 10 a running sum of 999/20 gives 499.49999999999994 (kept step 499)
    # while 10 * 999/20 is 499.5 (which would round to 500); IDDPM and DiT use the running sum.
    steps = space_timesteps(1000, "21")
    assert 499 in steps and 500 not in steps and len(steps) == 21


def test_bad_respacing_strings_and_counts():
    with pytest.raises(ValueError, match="cannot parse"):
        space_timesteps(1000, "fast")
    with pytest.raises(ValueError, match="cannot take 11"):
        space_timesteps(10, "11")


def test_spaced_diffusion_keeps_alpha_bar_and_maps_timesteps():
    betas = get_named_beta_schedule("linear", 1000)
    original = torch.cumprod(1 - betas, 0)
    diffusion = create_diffusion("ddim25")
    assert diffusion.num_timesteps == 25 and diffusion.original_num_steps == 1000
    kept = torch.arange(0, 1000, 40)
    assert torch.equal(diffusion.timestep_map, kept)
    assert torch.allclose(diffusion.alphas_cumprod, original[kept], rtol=1e-12)

    seen = []

    def model(x, t):
        seen.append(t.clone())
        return torch.zeros(x.shape[0], 2 * x.shape[1], *x.shape[2:])

    diffusion.p_mean_variance(model, torch.zeros(3, 1, 2), torch.tensor([0, 1, 24]))
    diffusion.training_losses(model, torch.zeros(3, 1, 2), torch.tensor([2, 3, 4]))
    assert seen[0].tolist() == [0, 40, 960] and seen[1].tolist() == [80, 120, 160]


def test_all_timesteps_kept_is_the_original_diffusion():
    betas = get_named_beta_schedule("linear", 1000)
    diffusion = create_diffusion("")
    assert diffusion.num_timesteps == 1000
    assert torch.allclose(diffusion.betas, betas, rtol=1e-9)
    assert torch.equal(diffusion.timestep_map, torch.arange(1000))


def test_spaced_diffusion_rejects_out_of_range_steps():
    with pytest.raises(ValueError, match=r"subset of \[0, 10\)"):
        SpacedDiffusion(
            [0, 5, 10],
            betas=torch.full((10,), 0.1),
            model_mean_type=ModelMeanType.EPSILON,
            model_var_type=ModelVarType.FIXED_LARGE,
            loss_type=LossType.MSE,
        )


def test_create_diffusion_matches_dit_defaults():
    d = create_diffusion(timestep_respacing="")
    assert (d.loss_type, d.model_var_type, d.model_mean_type) == (
        LossType.MSE, ModelVarType.LEARNED_RANGE, ModelMeanType.EPSILON
    )
    assert create_diffusion(None).num_timesteps == 1000
    assert create_diffusion("", use_kl=True).loss_type == LossType.RESCALED_KL
    assert create_diffusion("", rescale_learned_sigmas=True).loss_type == LossType.RESCALED_MSE
    assert create_diffusion("", learn_sigma=False).model_var_type == ModelVarType.FIXED_LARGE
    assert create_diffusion("", learn_sigma=False, sigma_small=True).model_var_type == ModelVarType.FIXED_SMALL
    assert create_diffusion("", predict_xstart=True).model_mean_type == ModelMeanType.START_X
    cosine = create_diffusion("100", noise_schedule="cosine", diffusion_steps=500)
    assert cosine.num_timesteps == 100 and cosine.original_num_steps == 500
