"""Run checkpoints: saving and restoring everything a run needs to continue (``save_restore.py``), what a
checkpoint folder holds and whether it is intact (``catalog.py``), atomic publication and safe
loading of files (``files.py``), where a run's checkpoints live and which one to load
(``layout.py``, ``resume.py``), and loading model weights from any format users have
(``weights.py``, ``original_dit.py`` for facebookresearch/DiT files)."""

from ..errors import CheckpointError

__all__ = ["CheckpointError"]
