#!/bin/bash
#SBATCH --ntasks=16
#SBATCH --ntasks-per-node=8
#SBATCH --time=30
#SBATCH --partition=a100
module load openmpi
srun --mpi=pmix ./allreduce_bench
