#!/bin/bash
#SBATCH --dependency=bogus:1
python job.py
