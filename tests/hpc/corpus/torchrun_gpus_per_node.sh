#!/bin/bash
#SBATCH -J vit-l
#SBATCH -p a100
#SBATCH -N 2
#SBATCH --gpus-per-node=8
#SBATCH -t 1-00:00:00
export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)
export MASTER_PORT=29500
srun torchrun --nnodes 2 --nproc_per_node 8 --rdzv_endpoint $MASTER_ADDR:$MASTER_PORT vit.py
