#!/bin/bash
#SBATCH --part=a100 --cpus-per-t=2
#SBATCH --job=abbrev
#SBATCH -t 5
srun hostname
