#SBATCH -t 5
python job.py
