#!/bin/bash
#SBATCH --array=0-15:4
#SBATCH -t 0:30:00
python shard.py --start "$SLURM_ARRAY_TASK_ID" --count 4
