"""opendit_lite.interop.export_family: each diffusers family, trained here (fused AdaLN, selective
checkpointing, LoRA), written with save_pretrained and loaded by its plain diffusers class gives
the trained model's outputs (fp32, 1e-5); merged LoRA equals the adapted model; the adapters alone
(``export_lora``, the pipeline's own save_lora_weights, no base weights beside them) load into the
base model with the family pipeline's LoRA loader and with ``load_lora_adapter``; an EMA state dict
is what gets written."""

import inspect
import json
import os

import diffusers
import pytest
import torch
from safetensors import safe_open

from opendit_lite.errors import ConfigError
from opendit_lite.families import family_of
from opendit_lite.interop import LORA_WEIGHT_NAME, export_family
from opendit_lite.parallelization import parallelize
from tests.diffusers_families import FAMILIES, build, forward_inputs, output, randomize_adapters

TOL = 1e-5
PIPELINES = {"WanTransformer3DModel": "WanPipeline", "FluxTransformer2DModel": "FluxPipeline",
             "SD3Transformer2DModel": "StableDiffusion3Pipeline", "CogVideoXTransformer3DModel": "CogVideoXPipeline",
             "HunyuanVideoTransformer3DModel": "HunyuanVideoPipeline", "LTXVideoTransformer3DModel": "LTXPipeline",
             "QwenImageTransformer2DModel": "QwenImagePipeline",
             "ZImageTransformer2DModel": "ZImagePipeline",
             "Flux2Transformer2DModel": "Flux2Pipeline",
             "HunyuanVideo15Transformer3DModel": "HunyuanVideo15Pipeline"}


def _load_like_the_pipeline(folder: str, family: str, transformer: torch.nn.Module) -> None:
    """What ``pipeline.load_lora_weights(folder)`` does to the pipeline's transformer (a pipeline without
    a LoRA loader, HunyuanVideo 1.5's: ``transformer.load_lora_adapter``, what its users call)."""
    pipeline = getattr(diffusers, PIPELINES[family])
    if not hasattr(pipeline, "lora_state_dict"):
        transformer.load_lora_adapter(folder, weight_name=LORA_WEIGHT_NAME)
        return
    state, metadata = pipeline.lora_state_dict(folder, return_lora_metadata=True)
    if "network_alphas" in inspect.signature(pipeline.load_lora_into_transformer).parameters:
        pipeline.load_lora_into_transformer(state, network_alphas=None, transformer=transformer, metadata=metadata)
    else:
        pipeline.load_lora_into_transformer(state, transformer=transformer, metadata=metadata)


def _trained(family: str, lora_rank: int = 0, sp_group=None) -> torch.nn.Module:
    model = build(family)
    parallelize(model, sp_group=sp_group, fused_adaln=True, selective_ratio=0.5, lora_rank=lora_rank, lora_alpha=8.0)
    if lora_rank:
        randomize_adapters(model)
    return model.eval()


@torch.no_grad()
def _max_diff(a: torch.nn.Module, b: torch.nn.Module, family: str) -> float:
    inputs = forward_inputs(family)
    return (output(a.eval(), inputs) - output(b.eval(), inputs)).abs().max().item()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lora", ["none", "merged", "adapter"])
def test_the_plain_diffusers_class_loads_the_export_with_the_same_outputs(family, lora, tmp_path):
    model = _trained(family, lora_rank=0 if lora == "none" else 4)
    out = export_family(model, str(tmp_path / "transformer"), lora="merged" if lora == "none" else lora)
    if lora == "adapter":
        assert family_of(family).pipeline == PIPELINES[family]  # whose save_lora_weights wrote the file
        assert os.listdir(out) == [LORA_WEIGHT_NAME]  # the adapters alone: no copy of the base weights
        loaded = build(family)                          # the base the adapters were trained on
        assert _max_diff(loaded, model, family) > 1e-4  # the base alone is not the adapted model
        _load_like_the_pipeline(out, family, loaded)
    else:
        loaded = getattr(diffusers, family).from_pretrained(out)
        assert type(loaded).__name__ == family
    assert _max_diff(loaded, model, family) < TOL


def test_the_ema_state_is_what_gets_written(tmp_path):
    family = "WanTransformer3DModel"
    model = _trained(family, lora_rank=4)
    g = torch.Generator().manual_seed(5)
    ema = {k: v + 0.01 * torch.randn(v.shape, generator=g) if ".lora_" in k else v.clone()
           for k, v in model.state_dict().items()}  # the EMA averages the trained (adapter) weights
    out = export_family(model, str(tmp_path / "ema"), state=ema)
    reference = _trained(family, lora_rank=4)
    reference.load_state_dict(ema)
    assert _max_diff(diffusers.WanTransformer3DModel.from_pretrained(out), reference, family) < TOL
    assert _max_diff(reference, model, family) > 1e-4


def test_wrapper_keys_are_dropped_and_the_adapter_file_has_the_pipeline_layout(tmp_path):
    family = "FluxTransformer2DModel"
    model = _trained(family, lora_rank=2)
    wrapped = torch.nn.Module()
    wrapped.module = model  # like DDP / Colossal-AI's ModelWrapper
    state = {f"module._orig_mod.{k}": v for k, v in model.state_dict().items()}
    out = export_family(wrapped, str(tmp_path / "flux"), state=state, lora="adapter")
    with safe_open(f"{out}/{LORA_WEIGHT_NAME}", "pt") as f:
        keys, meta = list(f.keys()), json.loads(f.metadata()["lora_adapter_metadata"])
    assert keys and all(k.startswith("transformer.") and ".default." not in k for k in keys)
    assert meta["transformer.r"] == 2 and meta["transformer.lora_alpha"] == 8.0
    loaded = build(family)
    loaded.load_lora_adapter(out, weight_name=LORA_WEIGHT_NAME)
    assert _max_diff(loaded, model, family) < TOL


def test_bad_inputs_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not an export mode"):
        export_family(build("LTXVideoTransformer3DModel"), str(tmp_path / "x"), lora="fused")
    with pytest.raises(ConfigError, match="no diffusers model"):
        export_family(torch.nn.Linear(2, 2), str(tmp_path / "x"))
    model = build("LTXVideoTransformer3DModel")
    state = model.state_dict()
    state.pop(next(iter(state)))
    with pytest.raises(ConfigError, match="do not fit a fresh LTXVideoTransformer3DModel"):
        export_family(model, str(tmp_path / "x"), state=state)


def test_every_exported_file_has_the_mode_of_the_config(tmp_path):
    model = _trained("SD3Transformer2DModel", lora_rank=2)
    export_family(model, str(tmp_path / "sd3"))
    export_family(model, str(tmp_path / "sd3"), lora="adapter")
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.glob("sd3/*")}
    assert len(modes) == 3 and set(modes.values()) == {modes["config.json"]} == {0o644}, modes


def test_compiled_models_export_like_the_model(tmp_path):
    family = "CogVideoXTransformer3DModel"
    model = build(family).eval()
    parallelize(model, compile=True, compile_backend="eager")  # per-block compile: keys unchanged
    whole = torch.compile(model, backend="eager")               # a wrapper: keys under _orig_mod.
    out = export_family(whole, str(tmp_path / "cog"), state=whole.state_dict())
    assert _max_diff(diffusers.CogVideoXTransformer3DModel.from_pretrained(out), model, family) < TOL


def _export_under_sequence_parallelism(rank, world_size, family, folder):
    import torch.distributed as dist

    # the same seeds on both ranks; Ulysses over the 2 ranks: attention processors and hooks swapped
    model = _trained(family, lora_rank=2, sp_group=dist.group.WORLD)
    if rank == 0:
        export_family(model, folder)
    dist.barrier()
    return sum(p.numel() for p in model.parameters())


@pytest.mark.slow  # two spawned ranks: ~20-40 s on 2 busy cores
def test_a_sequence_parallel_model_exports_the_serial_model(tmp_path):
    from tests.distributed import run_distributed

    family = "WanTransformer3DModel"
    folder = str(tmp_path / "sp")
    run_distributed(_export_under_sequence_parallelism, world_size=2, args=(family, folder))
    assert _max_diff(diffusers.WanTransformer3DModel.from_pretrained(folder), _trained(family, lora_rank=2),
                     family) < TOL
