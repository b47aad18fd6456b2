"""The Colossal-AI booster plugin (DDP / ZeRO-1/2 / Gemini / grouped ZeRO), its mesh and sharded EMA."""

from ..distributed.mesh import DataSeqMesh, build_data_seq_mesh
from ..ema import ShardedEMA
from .opendit_plugin import OpenDiTPlugin

__all__ = ["OpenDiTPlugin", "ShardedEMA", "DataSeqMesh", "build_data_seq_mesh"]
