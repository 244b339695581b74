#!/bin/bash
#SBATCH -C rack1
#SBATCH -N 2
#SBATCH --gres=gpu:8
#SBATCH -t 10
srun hostname
