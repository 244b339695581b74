#!/bin/bash
#SBATCH --gres=gpu
#SBATCH -t 10
nvidia-smi
