#!/bin/bash
#SBATCH --time=90:30
#SBATCH --partition=h100
#SBATCH --gres=gpu:h100:1
python job.py
