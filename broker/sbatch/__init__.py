"""The sbatch language: options and #SBATCH lines parsed as sbatch reads them (parse, values)
and mapped onto a JobSpec through a slurm_compat section (compat). Pure: used by the drop-ins on
a login node and by the server's batch route alike."""
