"""Checks of the sampling settings shared by the image and video samplers."""

from ..config import ConfigError


def check_sample_settings(seed: int, batch_size: int) -> None:
    if seed < 0 or batch_size < 1:
        raise ConfigError(f"'sample.seed' must be >= 0 (it seeds one generator per sample with (seed, index)) and "
                          f"'sample.batch_size' >= 1; got {seed} and {batch_size}.")
