#!/bin/bash
#SBATCH --time=0-00:45:30
#SBATCH --partition=h100
#SBATCH --gres=gpu:h100:1
python job.py
