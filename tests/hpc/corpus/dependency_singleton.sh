#!/bin/bash
#SBATCH --dependency=singleton
#SBATCH --job-name=nightly-eval
#SBATCH -t 60
python nightly.py
