#!/bin/bash
#SBATCH --gres=gpu:h100:2
#SBATCH -p h100
#SBATCH -t 10
python finetune.py
