"""The planner counts a family's activations from a forward on the meta device; HunyuanVideo 1.5's
forward reads its inputs' values (whether the image states are all zero, its text tokens selected by
mask), so it is refused with a ConfigError that says so (exit 2 on the command line), not a traceback."""

import pytest
import torch

from opendit_lite.errors import ConfigError
from opendit_lite.plan.from_config import family_shape
from tests.parallel.tiny_families import CONFIGS


def test_a_model_whose_forward_reads_values_is_refused_by_the_planner():
    from diffusers import HunyuanVideo15Transformer3DModel

    with torch.device("meta"):
        model = HunyuanVideo15Transformer3DModel(**CONFIGS["hunyuan_video15"][1])
    with pytest.raises(ConfigError, match="forward reads its inputs' values .* cannot plan this model yet"):
        family_shape(model, 8)
