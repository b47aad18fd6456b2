"""The per-rank micro-batch of a run, from the global batch (the trainers' loaders and LiteGen's)."""


def micro_batch_size(cfg, dp_size: int) -> int:
    """Samples per rank and micro-step: ``global_batch_size / (dp_size x grad_accum_steps)``, so that
    one optimizer step sees ``global_batch_size`` samples over all data-parallel ranks
    (``config.validate_world`` checks that it divides)."""
    return cfg.global_batch_size // (dp_size * cfg.grad_accum_steps)
