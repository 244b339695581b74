#!/bin/bash
#SBATCH --begin=now+1hour
#SBATCH -t 5
python nightly.py
