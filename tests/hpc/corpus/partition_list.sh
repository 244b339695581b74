#!/bin/bash
#SBATCH -p a100,h100
#SBATCH --gres=gpu:8
#SBATCH -t 5
python job.py
