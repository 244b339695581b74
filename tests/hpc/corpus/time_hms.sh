#!/bin/bash
#SBATCH --time=12:00:00
#SBATCH --partition=h100
#SBATCH --gres=gpu:h100:1
python job.py
