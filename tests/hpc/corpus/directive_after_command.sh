#!/bin/bash
#SBATCH -t 10
echo "the first command ends the directives"
#SBATCH --nodes=3
#SBATCH --time=999
