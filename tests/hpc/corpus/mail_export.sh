#!/bin/bash
#SBATCH --mail-type=END,FAIL
#SBATCH --mail-user=ml-team@example.org
#SBATCH --export=ALL,DATASET=imagenet
#SBATCH -t 5
python job.py
