#!/bin/bash
#SBATCH --mem-per-cpu=1000
#SBATCH -c 4
#SBATCH -t 5
python preprocess.py
