#!/bin/bash
#SBATCH --gres=tpu:2
python job.py
