#!/bin/bash
#SBATCH --exclusive
#SBATCH --signal=B:USR1@120
#SBATCH -t 30
trap 'touch checkpoint.now' USR1
python train.py & wait
