#!/bin/bash
#SBATCH -t 10
#SBATCH -p a100
#SBATCH -J from-script
python job.py
