#!/bin/bash
#SBATCH -t UNLIMITED
#SBATCH -N 1
sleep 1
