#!/bin/bash
#SBATCH -N 2
#SBATCH -t 5
srun nvidia-smi -L
