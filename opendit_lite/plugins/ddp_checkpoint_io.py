"""Checkpoint IO of the DDP strategy: Colossal-AI's, with a sharded optimizer load that also works
on the CPU.

Colossal-AI's sharded optimizer loader finishes with an accelerator ``synchronize()``, which its
CPU accelerator refuses, so resuming a CPU run would fail. Here the shards are read the same way
(``weights_only`` applies, see ``checkpoint.py``) and handed to torch's own
``Optimizer.load_state_dict``, which validates the groups and moves each state to its parameter's
device and dtype. Saving is unchanged, so files stay Colossal-AI's format.
"""

from typing import Optional

import torch
from colossalai.booster.plugin.torch_ddp_plugin import TorchDDPCheckpointIO
from colossalai.checkpoint_io.index_file import CheckpointIndexFile
from colossalai.checkpoint_io.utils import load_state_dict_shards
from colossalai.interface import OptimizerWrapper


class DDPCheckpointIO(TorchDDPCheckpointIO):
    def load_sharded_optimizer(self, optimizer: OptimizerWrapper, index_file_path: str,
                               prefix: Optional[str] = None, low_cpu_mem_mode: bool = True, num_threads: int = 1):
        index = CheckpointIndexFile.from_file(index_file_path)
        group_file = index.get_param_group_filename()
        if group_file is None:
            raise RuntimeError(f"optimizer index {index_file_path} names no param-group file")
        # Saved groups list parameters by integer id, the keys of the saved state: torch's format.
        param_groups = torch.load(group_file, map_location="cpu", weights_only=True)
        files, _ = index.get_checkpoint_filenames()
        state = {}
        for shard in load_state_dict_shards(files, True, False, low_cpu_mem_mode):
            state.update(shard)
        optimizer.unwrap().load_state_dict({"state": state, "param_groups": param_groups})
