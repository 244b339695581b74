#!/bin/bash
#SBATCH -N 1-2
#SBATCH -t 5
srun hostname
