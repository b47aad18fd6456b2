"""Run checkpoints: saving and restoring everything a run needs to continue (``state.py``), where a
run's checkpoints live and which one to load (``layout.py``), and loading model weights from any
format users have (``weights.py``, ``original_dit.py`` for facebookresearch/DiT files)."""
