import pytest
import torch
import torch.nn as nn

from opendit_lite.diffusion.sampling_utils import initial_noise, resolve_device, standard_normal


def test_device_precedence():
    module = nn.Linear(2, 2).to(torch.device("meta"))
    noise = torch.zeros(1)
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert resolve_device(module, noise, "meta", None) == meta  # explicit argument first
    assert resolve_device(module, noise, None, None) == cpu  # then the given noise
    assert resolve_device(module, None, None, torch.Generator()) == meta  # then the module's parameters
    assert resolve_device(lambda x, t: x, None, None, torch.Generator()) == cpu  # then the generator
    assert resolve_device(lambda x, t: x, None, None, None) == cpu  # and finally the CPU


def test_initial_noise():
    # drawn on the generator's device (the CPU here), then moved: the same seed gives the same noise anywhere
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    a = initial_noise((2, 3), None, torch.device("cpu"), g1)
    assert a.shape == (2, 3) and torch.equal(a, torch.randn(2, 3, generator=g2))
    given = torch.ones(2, 3)
    assert torch.equal(initial_noise(None, given, torch.device("cpu"), None), given)
    with pytest.raises(ValueError, match="either the shape"):
        initial_noise(None, None, torch.device("cpu"), None)


def test_a_cpu_generator_draws_for_another_device():
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    moved = standard_normal((2, 3), g1, torch.device("meta"), torch.float32)
    assert moved.device.type == "meta" and moved.shape == (2, 3)
    torch.randn(2, 3, generator=g2)
    assert torch.equal(g1.get_state(), g2.get_state())  # the draw was made on the CPU generator
