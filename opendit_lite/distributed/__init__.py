"""Process groups and per-process state: launching (torchrun / Slurm / one process), the data x
sequence mesh and grouped-ZeRO groups, seeding and random-generator state."""

from .mesh import DataSeqMesh, block_groups, build_data_seq_mesh
from .process_group import cleanup_distributed, init_distributed
from .seed import seed_everything

__all__ = ["DataSeqMesh", "block_groups", "build_data_seq_mesh", "cleanup_distributed", "init_distributed",
           "seed_everything"]
