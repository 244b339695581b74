#!/bin/bash
#SBATCH -A isthmus
#SBATCH -q normal
#SBATCH -t 10
python job.py
