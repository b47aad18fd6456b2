"""An image-to-video transformer given without its pipeline (``model.path`` / ``model.config``: no images to
condition on) is refused when the run's config is checked, before any data or model is loaded (it was
refused at its first forward); the same transformer from its pipeline folder is the conditioning's."""

import pytest
import yaml

from opendit_lite.config import load_config
from opendit_lite.config.video_schema import VideoTrainConfig
from opendit_lite.errors import ConfigError
from opendit_lite.families.wan.tiny import _WAN_TRANSFORMER
from opendit_lite.training.video import validate_video_config


def test_a_wan_image_to_video_transformer_without_its_pipeline_is_refused_by_the_config_check(tmp_path):
    config = {k: list(v) if isinstance(v, tuple) else v
              for k, v in dict(_WAN_TRANSFORMER, in_channels=36, out_channels=16, image_dim=16).items()}
    tree = {"precision": "fp32", "model": {"name": "WanTransformer3DModel", "config": config},
            "data": {"type": "shapes", "num_frames": 5, "image_size": 16}, "text_encoder": {"kind": "shapes"}}
    path = tmp_path / "i2v.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match="in_channels=36 is an image-to-video transformer: it trains on the images "
                                          "its pipeline encodes. Give the pipeline folder"):
        validate_video_config(load_config(str(path), [], schema=VideoTrainConfig))
    tree["model"]["config"] = dict(config, in_channels=16)  # the text-to-video layout trains
    path.write_text(yaml.safe_dump(tree))
    validate_video_config(load_config(str(path), [], schema=VideoTrainConfig))
