#!/bin/bash
#SBATCH -n 4
#SBATCH --gpus-per-task=2
#SBATCH -t 10
srun python ddp.py
