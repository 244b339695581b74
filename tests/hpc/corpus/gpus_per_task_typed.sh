#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-task=a100:2
#SBATCH -t 10
srun python ddp.py
