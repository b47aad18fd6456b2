"""Qwen-Image's declared unused parameters (the last block's text-stream outputs) are exactly those
autograd gives no gradient, and ``parallelize`` freezes them (and reports it), so DDP and ZeRO see a
gradient for every trainable parameter; a family without the declaration is left as it is."""

from opendit_lite.models.capabilities import unused_parameters
from opendit_lite.parallelization import parallelize
from tests import diffusers_families as families


def test_unused_parameters_are_the_ones_without_a_gradient_and_parallelize_freezes_them():
    name = "QwenImageTransformer2DModel"
    model = families.build(name)
    families.loss(model, families.forward_inputs(name)).backward()
    assert set(unused_parameters(model)) == {n for n, p in model.named_parameters() if p.grad is None}
    assert unused_parameters(model) and all(n.startswith("transformer_blocks.1.") for n in unused_parameters(model))

    model = families.build(name)
    report = parallelize(model)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == set(unused_parameters(model)) and report.count("unused_parameters") == len(frozen)
    flux = families.build("FluxTransformer2DModel")
    assert unused_parameters(flux) == () and parallelize(flux).count("unused_parameters") == 0
