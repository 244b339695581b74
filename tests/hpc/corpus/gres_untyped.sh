#!/bin/bash
#SBATCH --gres=gpu:4
#SBATCH -t 10
python finetune.py
