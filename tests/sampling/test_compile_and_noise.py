"""Per-sample noise (the same whatever the batch) and ``sample.compile`` (dynamo-traced denoiser
equal to eager)."""

from functools import partial

import numpy as np
import pytest
import torch
from PIL import Image

from opendit_lite.diffusion.sampling_utils import SampleGenerators, standard_normal
from tests.sampling.test_parallel_sampling import image_args, run_script


def test_sample_noise_depends_only_on_seed_and_index():
    together = SampleGenerators(7, range(5)).standard_normal((5, 3, 4), "cpu", torch.float32)
    alone = torch.cat([SampleGenerators(7, [i]).standard_normal((1, 3, 4), "cpu", torch.float32) for i in range(5)])
    assert torch.equal(together, alone)
    assert not torch.equal(together[0], together[1])                          # samples differ
    other_seed = SampleGenerators(8, range(5)).standard_normal((5, 3, 4), "cpu", torch.float32)
    assert not torch.equal(together, other_seed)
    # A doubled (guidance) batch: each sample's generator draws its conditional row, then its unconditional one.
    gens = SampleGenerators(7, [3, 4])
    doubled = standard_normal((4, 2), gens, "cpu", torch.float32)
    again = SampleGenerators(7, [3, 4])
    rows = [again.generators[r % 2] for r in range(4)]
    assert torch.equal(doubled, torch.stack([torch.randn(2, generator=g) for g in rows]))
    with pytest.raises(ValueError, match="does not split"):
        gens.standard_normal((3, 2), "cpu", torch.float32)
    with pytest.raises(ValueError, match=">= 0"):
        SampleGenerators(-1, [0])


def grid(path):
    return np.asarray(Image.open(path)).astype(np.int16)


def test_compiled_denoiser_equals_eager(tmp_path, monkeypatch, capsys):
    """sample.compile compiles each block (parallelize's compile step) and samples what eager does."""
    args = image_args(str(tmp_path)) + ["sample.samples_per_class=1", "sample.num_sampling_steps=2"]
    eager = run_script("sample", args + [f"sample.output={tmp_path}/eager.png"])
    # Real dynamo tracing with the eager backend, so that no C++ compiler runs on CPU.
    monkeypatch.setattr(torch, "compile", partial(torch.compile, backend="eager"))
    compiled = run_script("sample", args + [f"sample.output={tmp_path}/compiled.png", "sample.compile=true"])
    assert "torch.compile" in capsys.readouterr().out  # parallelize's report: blocks compiled
    assert np.abs(grid(eager) - grid(compiled)).max() <= 1
