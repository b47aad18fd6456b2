#!/usr/bin/env bash
# Launch a training (or sampling) script on several nodes under Slurm: one torchrun agent per node,
# the agents meet at a c10d rendezvous on the first node of the allocation and start
# GPUS_PER_NODE workers each (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE are set by torchrun).
#
#   sbatch --nodes 2 scripts/launch_slurm.sh configs/dit_xl2_256.yaml zero_degree=2 group_zero=true
#   SCRIPT=train_video.py sbatch --nodes 4 scripts/launch_slurm.sh configs/video_stdit_xl.yaml sp_size=4
#
# Environment: SCRIPT (default train.py), GPUS_PER_NODE (default 8), RDZV_PORT (default 29500),
# HEAD_NODE (default: the allocation's first host), DRY_RUN=1 prints the command instead of running it.
# The arguments after the config are key=value overrides, passed on unchanged.
#SBATCH --job-name=opendit_lite
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --output=slurm-%j.out
set -euo pipefail

CONFIG=${1:?usage: sbatch --nodes N scripts/launch_slurm.sh CONFIG.yaml [key=value ...]}
shift
SCRIPT=${SCRIPT:-train.py}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
RDZV_PORT=${RDZV_PORT:-29500}
NNODES=${SLURM_NNODES:?run under sbatch/salloc (SLURM_NNODES is not set)}
HEAD_NODE=${HEAD_NODE:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}

# srun starts one task per node; each runs one torchrun agent. --rdzv_id keeps concurrent jobs
# on the same head node apart; the c10d backend needs no extra service.
CMD=(srun --ntasks-per-node=1 --kill-on-bad-exit=1
     torchrun --nnodes "$NNODES" --nproc_per_node "$GPUS_PER_NODE"
     --rdzv_id "${SLURM_JOB_ID:-opendit_lite}" --rdzv_backend c10d --rdzv_endpoint "$HEAD_NODE:$RDZV_PORT"
     "$SCRIPT" --config "$CONFIG" "$@")

if [[ "${DRY_RUN:-0}" == 1 ]]; then
    echo "${CMD[@]}"
else
    exec "${CMD[@]}"
fi
