#!/bin/bash
#SBATCH -N 3
#SBATCH --gres=gpu:a100:8
#SBATCH -t 10
srun hostname
