#!/bin/bash
#SBATCH --nodes=0
python job.py
