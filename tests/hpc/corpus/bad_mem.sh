#!/bin/bash
#SBATCH --mem=1Q
python job.py
