import os
import types

import pytest
import yaml

from opendit_lite.config import (
    ConfigError,
    DiffusionConfig,
    TrainConfig,
    from_dict,
    load_config,
    parse_overrides,
    validate_world,
)
from opendit_lite.config.loader import all_keys, format_help

LITEGEN_KEYS = [
    "exp_name", "results_dir", "checkpoint_dir", "init_from", "resume_from", "auto_resume", "precision",
    "grad_precision", "allow_tf32", "lr", "weight_decay", "fused_optimizer", "zero_degree", "group_zero",
    "sp_size", "fused_layernorm", "ac_offload", "selective_ratio", "ema.enable", "ema.sharded",
    "ema.resume_from", "encoder.fsdp", "encoder.group", "global_seed", "max_steps", "num_workers",
    "pin_memory", "global_batch_size",
]


def test_litegen_field_names_exist():
    keys = set(all_keys())
    assert [k for k in LITEGEN_KEYS if k not in keys] == []


def test_litegen_style_yaml_loads(tmp_path):
    """A config written for LiteGen (its README's field list) loads unchanged."""
    text = """
exp_name: video_generation_exp1
results_dir: path_to_the_results_dir
init_from: null
auto_resume: False
precision: bf16
grad_precision: fp32
allow_tf32: True
lr: 1e-4
weight_decay: 0.0
fused_optimizer: True
selective_ratio: 0
ac_offload: True
zero_degree: 3
group_zero: True
sp_size: 1
fused_layernorm: True
ema:
  enable: True
  sharded: True
  resume_from: null
encoder:
  fsdp: True
  group: False
global_seed: 42
max_steps: 100
num_workers: 2
pin_memory: True
global_batch_size: 16
"""
    path = tmp_path / "litegen.yaml"
    path.write_text(text)
    cfg = load_config(str(path))
    assert cfg.zero_degree == 3 and cfg.group_zero and cfg.ac_offload and cfg.selective_ratio == 0.0
    assert cfg.lr == 1e-4 and cfg.ema.sharded and cfg.encoder.fsdp and cfg.global_batch_size == 16


def test_precedence_cli_over_file_over_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"lr": 0.5, "max_steps": 7, "model": {"name": "DiT-B/2"}}))
    cfg = load_config(str(path), ["lr=0.25", "model.learn_sigma=false", "sample.class_labels=[1, 2]"])
    assert cfg.lr == 0.25                       # command line wins
    assert cfg.max_steps == 7                   # file beats default
    assert cfg.model.name == "DiT-B/2" and cfg.model.learn_sigma is False
    assert cfg.weight_decay == TrainConfig().weight_decay
    assert cfg.sample.class_labels == [1, 2]


def test_aliases_of_other_tools():
    cfg = load_config(None, ["result_dir=r", "run_name=n", "seed=3"])
    assert (cfg.results_dir, cfg.exp_name, cfg.global_seed) == ("r", "n", 3)


def test_override_values_are_yaml():
    assert parse_overrides(["a=1", "b.c=true", "d=[1,2]", "e=null", "f=x=y"]) == {
        "a": 1, "b": {"c": True}, "d": [1, 2], "e": None, "f": "x=y"}


@pytest.mark.parametrize("overrides, message", [
    (["bogus_key=1"], "Unknown config key 'bogus_key'"),
    (["zer_degree=1"], "Did you mean 'zero_degree'?"),
    (["ema.decy=0.5"], "Did you mean 'ema.decay'?"),
    (["zero_degree=4"], "'zero_degree' must be one of 0, 1, 2, 3; got 4"),
    (["precision=fp4"], "'precision' must be one of"),
    (["selective_ratio=-0.1"], "'selective_ratio' must lie in [0, 1]"),
    (["lr=fast"], "'lr' must be a number"),
    (["max_steps=1.5"], "'max_steps' must be an integer"),
    (["auto_resume=maybe"], "'auto_resume' must be true or false"),
    (["sp_size=0"], "'sp_size' must be a positive integer"),
    (["ema=3"], "'ema' must be a mapping"),
    (["data.type=latents"], "'data.path' is required"),
    (["data.path=/no/such/folder"], "does not exist"),
    (["ac_offload=true"], "'ac_offload' offloads the inputs of checkpointed blocks"),
    (["novalue"], "overrides are written key=value"),
])
def test_bad_input_explains_itself(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))


def test_world_dependent_checks():
    cfg = load_config(None, ["global_batch_size=12", "sp_size=2"])
    validate_world(cfg, 4)  # dp = 2 divides 12
    with pytest.raises(ConfigError, match="must divide the number of ranks"):
        validate_world(cfg, 3)
    cfg = load_config(None, ["global_batch_size=10", "grad_accum_steps=4"])
    expected = "global_batch_size'=10 must be divisible by data-parallel size x grad_accum_steps = 1 x 4"
    with pytest.raises(ConfigError, match=expected):
        validate_world(cfg, 1)


def test_help_lists_every_key_with_its_meaning():
    text = format_help()
    for key in LITEGEN_KEYS + ["model.name", "sample.cfg_scale"]:
        assert key in text
    assert "fraction of blocks NOT checkpointed" in text


def test_repository_configs_load():
    root = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
    for name in sorted(os.listdir(root)):
        if name.endswith(".yaml") and not name.startswith("video"):
            with open(os.path.join(root, name)) as f:
                data = yaml.safe_load(f)
            data.get("data", {}).pop("path", None)  # real data folders are not on the test machine
            data.get("data", {})["type"] = "shapes"
            from opendit_lite.builders.family import config_schema  # a diffusers family's config is a video one

            schema = config_schema(data)
            assert isinstance(from_dict(schema, data), schema), name


def test_attribute_access_objects_work_like_configs():
    """The library reads settings with attribute access, so an EasyDict-like object works too."""
    from opendit_lite.converter import ModuleConverter

    ModuleConverter(types.SimpleNamespace(fused_layernorm=False))


# --------------------------------------------------------------------------------------------------
# Aliases (one table, resolved in one place), hints, and the one reader of config objects
# --------------------------------------------------------------------------------------------------

def test_renamed_fields_keep_their_old_names(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("diffusion:\n  scheduler: rflow\n  sample_method: uniform\n")
    cfg = load_config(str(path))
    assert (cfg.diffusion.objective, cfg.diffusion.timestep_sampling) == ("rflow", "uniform")
    cfg = load_config(None, ["diffusion.scheduler=rflow"])
    assert cfg.diffusion.objective == "rflow"
    # a config saved with a checkpoint before the rename still reads
    assert from_dict(DiffusionConfig, {"scheduler": "rflow"}, "diffusion.").objective == "rflow"


def test_other_trainers_spellings(tmp_path):
    cfg = load_config(None, ["learning_rate=3e-4", "max_train_steps=5", "gradient_accumulation_steps=2",
                             "mixed_precision=fp32", "output_dir=o", "max_grad_norm=0.5", "dataloader_num_workers=1"])
    assert (cfg.lr, cfg.max_steps, cfg.grad_accum_steps, cfg.precision) == (3e-4, 5, 2, "fp32")
    assert (cfg.results_dir, cfg.grad_clip, cfg.num_workers) == ("o", 0.5, 1)
    path = tmp_path / "c.yaml"
    path.write_text("learning_rate: 0.5\n")
    assert load_config(str(path), ["lr=0.25"]).lr == 0.25  # the command line still wins over the file
    with pytest.raises(ConfigError, match="'learning_rate' and 'lr' are the same setting"):
        load_config(None, ["learning_rate=1", "lr=2"])


@pytest.mark.parametrize("key, suggestion", [
    ("batch_size", "Did you mean global_batch_size (samples per optimizer step over all ranks"),
    ("train_batch_size", "Did you mean global_batch_size"),
    ("use_ema", "Did you mean ema.enable?"),
    ("learnin_rate", "Did you mean 'lr'?"),  # near an alias: its field is suggested
    ("lerning_rate", "Did you mean 'lr'?"),
])
def test_unknown_keys_suggest_what_works(key, suggestion):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}=1"])
    assert suggestion in str(e.value)
    assert "selective_ratio" not in str(e.value)


def test_help_lists_aliases():
    text = format_help()
    assert "[also: learning_rate]" in text
    assert "[also: diffusion.scheduler]" in text and "[also: diffusion.sample_method]" in text


def test_precision_default_is_auto_and_ema_sharded_false_is_refused():
    assert TrainConfig().precision == "auto"
    with pytest.raises(ConfigError, match="'ema.sharded'=false is not supported"):
        load_config(None, ["ema.sharded=false"])


def test_from_object_reads_any_config_kind():
    from opendit_lite.config import from_object

    nested = types.SimpleNamespace(zero_degree=None, lr=2e-4, ema={"decay": 0.5},
                                   diffusion=types.SimpleNamespace(scheduler="rflow"))
    cfg = from_object(nested)
    assert isinstance(cfg, TrainConfig)
    assert (cfg.zero_degree, cfg.lr, cfg.ema.decay, cfg.diffusion.objective) == (0, 2e-4, 0.5, "rflow")  # None: default
    assert from_object({"exp_name": "e", "learning_rate": 1e-3}).lr == 1e-3
    assert from_object(cfg) is cfg
    with pytest.raises(ConfigError, match="Unknown config key 'zer_degree'. Did you mean 'zero_degree'?"):
        from_object({"zer_degree": 1})
    with pytest.raises(ConfigError, match="'selective_ratio' must lie in"):
        from_object({"selective_ratio": 2})  # validated once, here
    ignored = []
    cfg = from_object({"lr": 0.1, "my_model": {"depth": 3}, "ema": {"decay": 0.9, "extra": 1}}, strict=False,
                      ignored=ignored)
    assert cfg.lr == 0.1 and cfg.ema.decay == 0.9 and ignored == ["my_model", "ema.extra"]


def test_grad_precision_other_than_the_parameter_dtype_is_refused():
    from opendit_lite.training.loop import build_booster

    info = types.SimpleNamespace(device=types.SimpleNamespace(type="cpu"), local_world_size=1)
    cfg = load_config(None, ["precision=fp32", "grad_precision=bf16"])
    with pytest.raises(ConfigError, match="'grad_precision'='bf16' is not supported.*set it to fp32"):
        build_booster(cfg, info)
