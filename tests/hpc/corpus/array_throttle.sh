#!/bin/bash
#SBATCH --array=0-5%2
#SBATCH --time=5
#SBATCH --gres=gpu:1
#SBATCH --job-name=sweep
python sweep.py --trial "$SLURM_ARRAY_TASK_ID"
