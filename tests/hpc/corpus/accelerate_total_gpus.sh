#!/bin/bash
#SBATCH --job-name=accel
#SBATCH --nodes=2
#SBATCH --gpus=16
#SBATCH --time=120
#SBATCH -p a100

srun accelerate launch --num_processes 16 --num_machines 2 \
  --machine_rank $SLURM_NODEID --main_process_ip $(scontrol show hostnames | head -1) train.py
