#!/bin/bash
#SBATCH -N two
python job.py
