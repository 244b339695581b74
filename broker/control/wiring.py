"""Builds the control loop from isthmus.yaml: backend adapters through the registry, the
control plane, the lease and the runtime."""

from __future__ import annotations

import importlib
import logging

from backends.base import Backend, factory_for
from broker.config import IsthmusConfig
from broker.control.lease import LeaderLease
from broker.control.plane import ControlParams, ControlPlane
from broker.control.runtime import Intervals, Runtime
from broker.store.db import Database

log = logging.getLogger("isthmus.control")


def build_backends(config: IsthmusConfig) -> dict[str, Backend]:
    """One adapter per configured backend. One that cannot be built is left out with an
    error in the log: its pools are then absent and jobs that need them wait with a reason."""
    out: dict[str, Backend] = {}
    for b in config.backends:
        pools = [p for p in config.pools if p.backend == b.name]
        try:
            importlib.import_module(f"backends.{b.kind.value}")
            out[b.name] = factory_for(b.kind.value)(b, pools)
        except Exception as exc:
            log.error("backend %s (%s) is not available: %s", b.name, b.kind.value, exc)
    return out


def build_runtime(config: IsthmusConfig, db: Database) -> Runtime:
    c = config.control
    plane = ControlPlane(
        db, config, build_backends(config), params=ControlParams(lost_grace_s=c.lost_grace)
    )
    lease = LeaderLease(db, ttl=c.lease_ttl)
    intervals = Intervals(
        admission=c.admission_interval, dispatch=c.dispatch_interval,
        reconcile=c.reconcile_interval, lease_ttl=c.lease_ttl,
    )
    return Runtime(plane, lease, intervals)
