"""HPC drop-ins: isbatch (and later isqueue, iscancel, isacct) for users of sbatch scripts.

``sbatch_values`` parses single option values the way Slurm does, ``sbatch_parse`` reads a
script, the SBATCH_* environment and the command line into one normalised request, and
``isbatch`` is the command.
"""
