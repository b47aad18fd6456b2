"""Memory planning: how large a batch each bucket can take on a device of a given size, and which
zero_degree / sp_size / selective_ratio / offload the run needs. ``python -m opendit_lite.plan``
prints a plan for a config; ``bucket_batch: auto`` in a video config sizes its buckets with it.

From a config: ``from_config.py``; the memory arithmetic: ``memory_model.py``; the choice:
``planner.py``. The names below are imported on first use, so that the command checks its
arguments and config before torch is imported.
"""

from ..utils.lazy_exports import lazy_exports

_LAZY = {
    **{name: "from_config" for name in ("CAPTION_WIDTHS", "Costs", "LatentBucket", "adapted_model", "family_shape",
                                        "host_budget", "latent_buckets", "memory_options", "memory_settings",
                                        "model_of_config", "model_shape_of_config", "plan_bucket_batches",
                                        "plan_config", "plan_precision")},
    "ModelShape": "memory_model",
    **{name: "planner" for name in ("HostBudget", "MemoryOptions", "Plan", "Setting", "plan", "smallest_card")},
    **{name: "weight_costs" for name in ("Speed", "WeightShape")},
    "released_config": "released",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = sorted(_LAZY)
