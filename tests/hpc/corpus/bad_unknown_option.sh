#!/bin/bash
#SBATCH --gpu-type=a100
python job.py
