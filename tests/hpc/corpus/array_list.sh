#!/bin/bash
#SBATCH -a 1,3,5-7
#SBATCH -t 15
echo task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID
