"""Isthmus broker core: one job lifecycle and one quota ledger across Slurm and Kubernetes."""

__version__ = "0.1.0"
