#!/bin/bash
#SBATCH --array=5-1
python job.py
