"""Simulated backend (same protocol as Slurm and Kubernetes) for simulation and benchmarks."""

from backends.base import register
from backends.sim.backend import (
    DURATION_ENV,
    ExternalLoad,
    SimBackend,
    SimClock,
    SimFailures,
    SimPoolSpec,
)

register("sim", SimBackend)

__all__ = [
    "DURATION_ENV",
    "ExternalLoad",
    "SimBackend",
    "SimClock",
    "SimFailures",
    "SimPoolSpec",
]
