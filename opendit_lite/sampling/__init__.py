"""Sampling shared by sample.py, sample_video.py and ``python -m opendit_lite.evaluate``: one path
for images and videos.

* ``sharding.py``: where each process samples. The requested samples are split into contiguous
  blocks over the data-parallel ranks (``SamplingRanks.batches``); with ``sp_size > 1`` the ranks
  of one sequence-parallel group sample the same block and shard each sample's tokens (the
  training machinery: Ulysses or DSP). ``gather_on_main``: the finished samples, in index order,
  on rank 0 (which writes the files).
* Sample ``i``'s noise comes from a generator seeded by ``(seed, i)``
  (``opendit_lite.diffusion.SampleGenerators``), so the output does not depend on the rank layout
  or batch size: ``torchrun --nproc_per_node 8 sample.py`` writes the one-process grid.
* ``denoiser.py``: the checkpoint (of the sampler's model family), the trained sections adopted
  from its saved config, and the model loaded and parallelized for sampling
  (``parallelize_from_config(..., sampling=True)``: kernels, Ulysses/DSP, ``sample.compile``).
* ``sampler.py``: the sampler fits the objective (``check_sampler``) and runs (``denoise``:
  euler, ddpm or ddim).
* ``image.py`` / ``video.py``: what differs: class labels and batched guidance / prompts, caption
  states and clip shapes.
* ``outputs.py``: the files: a labelled PNG grid; MP4s (or GIFs) and a contact sheet.
"""

from .sharding import SamplingRanks, gather_on_main, sampling_ranks

__all__ = ["SamplingRanks", "gather_on_main", "sampling_ranks"]
