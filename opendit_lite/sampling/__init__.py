"""Sampling shared by sample.py, sample_video.py and ``python -m opendit_lite.evaluate``.

* ``sampling_ranks``: where each process samples. The requested samples are split into contiguous
  blocks over the data-parallel ranks; with ``sp_size > 1`` the ranks of one sequence-parallel group
  sample the same block and shard each sample's tokens (the training machinery: Ulysses or DSP).
* Sample ``i``'s noise comes from a generator seeded by ``(seed, i)``
  (``opendit_lite.diffusion.SampleGenerators``), so the output does not depend on the rank layout
  or batch size: ``torchrun --nproc_per_node 8 sample.py`` writes the one-process grid.
* ``gather_on_main``: the finished samples, in index order, on rank 0 (which writes the files).
* ``opendit_lite.build.denoiser.parallelize_denoiser``: ``parallelize`` for sampling (kernels,
  Ulysses/DSP over the sampling mesh, ``sample.compile``).
* ``image.py``: class-conditional image generation with batched classifier-free guidance.
"""

from .ranks import SamplingRanks, gather_on_main, sampling_ranks

__all__ = ["SamplingRanks", "gather_on_main", "sampling_ranks"]
