#!/bin/bash
#SBATCH -N 2 extra
python job.py
