#!/bin/bash
#SBATCH --dependency=afterok:@PARENT@
#SBATCH --job-name=eval
#SBATCH -t 20
python eval.py --ckpt last.pt
