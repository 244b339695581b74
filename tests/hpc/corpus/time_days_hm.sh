#!/bin/bash
#SBATCH --time=1-06:30
#SBATCH --partition=h100
#SBATCH --gres=gpu:h100:1
python job.py
