#!/bin/bash
#SBATCH --array=1-2
#SBATCH --output=%x-%A_%a.out
#SBATCH --error=%j-%N.err
#SBATCH -t 5
echo $SLURM_ARRAY_TASK_ID
