#!/bin/bash
#SBATCH --signal=FOO@60
python job.py
