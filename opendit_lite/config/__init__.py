from .loader import (
    ConfigError,
    check_sections,
    from_dict,
    from_object,
    load_config,
    parse_cli,
    parse_overrides,
    resolve_aliases,
    to_dict,
    validate,
    validate_world,
)
from .loader import _read_yaml as read_yaml  # the checks every entry point reads a config file through
from .schema import (
    DataConfig,
    DiffusionConfig,
    EMAConfig,
    EncoderConfig,
    ModelConfig,
    SampleConfig,
    TrainConfig,
    VAEConfig,
)
from .video_schema import train_script_schema

__all__ = [
    "ConfigError", "check_sections", "from_dict", "from_object", "load_config", "parse_cli", "parse_overrides",
    "read_yaml", "resolve_aliases", "to_dict",
    "validate", "validate_world", "DataConfig", "DiffusionConfig", "EMAConfig", "EncoderConfig",
    "ModelConfig", "SampleConfig", "TrainConfig", "VAEConfig", "train_script_schema",
]
