#!/bin/bash
#SBATCH -J short -p a100 -N 1 -n 1 -c 4 -t 5 -o out-%j.txt -e err-%j.txt -D /tmp
srun hostname
