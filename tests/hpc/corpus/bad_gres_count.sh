#!/bin/bash
#SBATCH --gres=gpu:a100:x
python job.py
