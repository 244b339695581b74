#!/bin/bash
#SBATCH -n 4
#SBATCH -t 10:00
mpirun -np $SLURM_NTASKS ./hello
