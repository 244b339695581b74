#!/bin/bash
# A comment before the directives is fine.

#SBATCH --job-name="bert large"   # quoted, with a trailing comment
## SBATCH --nodes=64          (doubled hash: a plain comment)
# SBATCH --time=99             (space after the hash: a plain comment)
#SBATCH --comment='run #3'
#SBATCH -t 20 -N 1            # two options on one line
#SBATCH --gres=gpu:2#no space before this comment
python bert.py
