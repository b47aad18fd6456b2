"""Selective activation checkpointing with offload on the diffusers families: the blocks come from
the declared block lists (not guessed), the loss and every gradient equal the model without
checkpointing, the offload path really copies the block inputs out and back (a host-copy stand-in
for the CUDA copier, as in test_offload.py), and diffusers' own gradient checkpointing is turned
off with a warning instead of checkpointing each block twice."""

import importlib

import pytest
import torch

from opendit_lite.activation_checkpointing import apply_activation_checkpointing
from opendit_lite.activation_checkpointing import offload as offload_module
from opendit_lite.families import FAMILIES as REGISTERED
from opendit_lite.models.blocks import find_blocks
from opendit_lite.parallelization import parallelize
from tests import diffusers_families as families
from tests.activation_checkpointing.test_offload import RecordingCopier

BLOCKS = {
    "WanTransformer3DModel": ["blocks.0", "blocks.1"],
    "FluxTransformer2DModel": ["transformer_blocks.0", "single_transformer_blocks.0"],
    "SD3Transformer2DModel": ["transformer_blocks.0", "transformer_blocks.1"],
    "CogVideoXTransformer3DModel": ["transformer_blocks.0", "transformer_blocks.1"],
    "HunyuanVideoTransformer3DModel": ["transformer_blocks.0", "single_transformer_blocks.0"],
    "LTXVideoTransformer3DModel": ["transformer_blocks.0", "transformer_blocks.1"],
    "QwenImageTransformer2DModel": ["transformer_blocks.0", "transformer_blocks.1"],
    "ZImageTransformer2DModel": ["layers.0", "layers.1"],
    "Flux2Transformer2DModel": ["transformer_blocks.0", "single_transformer_blocks.0"],
    "HunyuanVideo15Transformer3DModel": ["transformer_blocks.0", "transformer_blocks.1"],
}


def test_declarations_name_the_installed_diffusers_classes():
    from diffusers import ModelMixin

    declared = [family.class_path for family in REGISTERED.values()]
    for path in declared:
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name, None)
        assert isinstance(cls, type) and issubclass(cls, ModelMixin), f"{path} is not a diffusers model class"
    assert {path.rpartition(".")[2] for path in declared} == set(families.FAMILIES) | set(families.TESTED_APART)


@pytest.mark.parametrize("name", families.FAMILIES)
def test_blocks_are_the_declared_lists_in_forward_order(name):
    model = families.build(name)
    names = {id(m): n for n, m in model.named_modules()}
    assert [names[id(b)] for b in find_blocks(model)] == BLOCKS[name]


def gradients(model, inputs):
    model.zero_grad()
    loss = families.loss(model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("ratio", [0.0, 0.5])
@pytest.mark.parametrize("name", families.FAMILIES)
def test_checkpointing_with_offload_is_exact(name, ratio, monkeypatch):
    copier = RecordingCopier()
    monkeypatch.setattr(offload_module, "_copier_for_device", lambda device: copier)
    inputs = families.forward_inputs(name)
    ref_loss, ref_grads = gradients(families.build(name), inputs)
    model = families.build(name)
    report = apply_activation_checkpointing(model, ratio, offload=True)
    assert report.source.startswith("declared block lists") and list(report.blocks) == BLOCKS[name]
    assert len(report.checkpointed) == (2 if ratio == 0.0 else 1)
    loss, grads = gradients(model, inputs)
    assert ("out", 0) in copier.log and any(event[0] == "finish" for event in copier.log), copier.log
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-7)
    assert grads.keys() == ref_grads.keys()
    for key in grads:
        torch.testing.assert_close(grads[key], ref_grads[key], rtol=1e-6, atol=1e-7, msg=key)


def test_diffusers_own_checkpointing_is_turned_off_with_a_warning():
    name = "FluxTransformer2DModel"
    inputs = families.forward_inputs(name)
    ref_loss, ref_grads = gradients(families.build(name), inputs)
    model = families.build(name)
    model.enable_gradient_checkpointing()
    with pytest.warns(UserWarning, match="own gradient checkpointing .* turned off"):
        report = parallelize(model, selective_ratio=0.5)
    assert not model.is_gradient_checkpointing and report.checkpointing.disabled_builtin
    assert "turned off" in str(report.checkpointing) and "(warned)" in str(report)
    loss, grads = gradients(model, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-7)
    for key in grads:
        torch.testing.assert_close(grads[key], ref_grads[key], rtol=1e-6, atol=1e-7, msg=key)


def test_checkpointing_off_says_that_diffusers_own_is_on():
    model = families.build("WanTransformer3DModel")
    model.enable_gradient_checkpointing()
    report = parallelize(model, selective_ratio=1.0)
    row = next(r for r in report.rows if r.step == "activation_checkpointing")
    assert row.swapped == "off" and "own gradient checkpointing (diffusers') is on" in row.left
    assert model.is_gradient_checkpointing  # left as the user set it
