import pytest

from opendit_lite.diffusion import SCHEDULERS, RectifiedFlow, SpacedDiffusion, build_scheduler, register_scheduler


def test_build_registered_schedulers():
    iddpm = build_scheduler("iddpm")
    assert isinstance(iddpm, SpacedDiffusion) and iddpm.num_timesteps == 1000
    assert build_scheduler("iddpm", timestep_respacing="ddim10").num_timesteps == 10
    rflow = build_scheduler("rflow", sample_method="logit-normal", shift=2.0)
    assert isinstance(rflow, RectifiedFlow) and rflow.shift == 2.0


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(KeyError, match="'ddpm'") as info:
        build_scheduler("ddpm")
    assert "iddpm" in str(info.value) and "rflow" in str(info.value)


def test_duplicate_registration_is_an_error():
    name = "test-only-scheduler"
    try:
        register_scheduler(name)(dict)
        with pytest.raises(ValueError, match="already registered"):
            register_scheduler(name)(list)
    finally:
        SCHEDULERS.pop(name, None)
