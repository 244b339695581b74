#!/bin/bash
#SBATCH -G 8
#SBATCH -t 10
python single_node.py
