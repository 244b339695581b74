"""Simulated backend (same protocol as Slurm and Kubernetes) for demos, simulation and
benchmarks.

broker/wiring builds a LiveSimBackend (wall time, `speed` x faster) from an isthmus.yaml
``backends[]`` entry of kind ``sim`` (its settings: the fields of ``SimSettings``) and the
pools that name it (their shapes as ``SimPoolSpec``s), through the same path as every kind.
Tests and benchmarks drive a ``SimBackend`` on a virtual ``SimClock`` instead.
"""

from __future__ import annotations

from backends.sim.backend import DURATION_ANNOTATION, DURATION_ENV, SimBackend
from backends.sim.clock import SimClock, WallClock
from backends.sim.faults import FAIL_ANNOTATION, Fault
from backends.sim.live import LiveSimBackend, build
from backends.sim.model import ExternalLoad, SimFailures, SimPoolSpec
from backends.sim.settings import SimSettings

__all__ = [
    "DURATION_ANNOTATION",
    "DURATION_ENV",
    "FAIL_ANNOTATION",
    "ExternalLoad",
    "Fault",
    "LiveSimBackend",
    "SimBackend",
    "SimClock",
    "SimFailures",
    "SimPoolSpec",
    "SimSettings",
    "WallClock",
    "build",
]
