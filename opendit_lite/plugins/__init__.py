"""The Colossal-AI booster plugin (DDP / ZeRO-1/2 / Gemini / grouped ZeRO), its mesh and sharded EMA."""

from ..ema import ShardedEMA
from ..distributed.mesh import DataSeqMesh, build_data_seq_mesh
from .opendit_plugin import OpenDiTPlugin

__all__ = ["OpenDiTPlugin", "ShardedEMA", "DataSeqMesh", "build_data_seq_mesh"]
