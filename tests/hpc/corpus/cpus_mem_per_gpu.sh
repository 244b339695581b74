#!/bin/bash
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-gpu=2
#SBATCH --mem-per-gpu=2G
#SBATCH -t 10
python train.py
