"""Config -> objects: the builders the trainers, the samplers, the planner and the scripts share.

* ``image.py``: the image dataset, the model with its input geometry resolved from the data, the VAE;
* ``video.py``: the clip dataset and its buckets, the caption encoder, the per-frame VAE, the
  text-to-video model and its geometry;
* ``diffusers_model.py``: a diffusers family's model from ``model.path``, ``model.config`` or
  ``model.pipeline``'s transformer, its recipe and its denoiser (the family found through
  ``opendit_lite.families``);
* ``pipeline.py``: a run from a diffusers pipeline folder (``model.pipeline``): the folder's checks and
  what it settles in the config, its encoders, the shift of its scheduler and the denoiser fed what
  the pipeline feeds its transformer;
* ``family.py``: a model's family (image or video, as its class declares) checked against the script;
* ``parallelize.py``: ``parallelize_from_config``, the one place config fields meet ``parallelize``
  (training, LiteGen and sampling);
* ``geometry.py``: a config's buckets in latent units and tokens, and the sequence-parallel workload
  ``sp_mode: auto`` decides from (the run and the planner alike);
* ``batch.py``: the per-rank micro-batch of the global batch;
* ``objective.py``: IDDPM or rectified flow from the ``diffusion`` section;
* ``lora_checkpoint.py``: a LoRA run's checkpoint loaded with its adapters merged (samplers, export).

This floor sits above the models, families, data, encoders, diffusion, plugins and checkpoints it builds,
and below the trainers, samplers and planner that call it; it imports none of those (the planner's
``bucket_batch: auto`` is called by the video trainer).
"""
