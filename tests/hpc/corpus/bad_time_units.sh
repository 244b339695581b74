#!/bin/bash
#SBATCH --time=2h
python job.py
