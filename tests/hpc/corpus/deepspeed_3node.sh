#!/bin/bash
#SBATCH --job-name=ds-zero3
#SBATCH --nodes=3
#SBATCH --gpus-per-node=a100:8
#SBATCH --time=2-0
#SBATCH --mem=15G
#SBATCH --partition=a100
hostfile=$(mktemp)
for h in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do echo "$h slots=8" >> "$hostfile"; done
deepspeed --hostfile "$hostfile" train.py --deepspeed ds_config.json
