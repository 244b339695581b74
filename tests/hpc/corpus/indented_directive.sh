#!/bin/bash
  #SBATCH --nodes=3
#SBATCH -t 7
srun hostname
