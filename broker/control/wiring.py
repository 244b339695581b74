"""Builds the control loop from isthmus.yaml: backend adapters through the registry, the
control plane, the lease and the runtime; and checks the backends' settings with the same
per-kind schemas the adapters are built with (`isthmus config check` and the server start
both call `check_backends`, so the server never starts on a file the check refuses).

broker/config.py stays free of backend imports: it knows a backend's kind and its settings as
a mapping; what the settings of each kind mean is the adapter package's business."""

from __future__ import annotations

import importlib
import logging

from backends.base import Backend, check_for, factory_for
from broker.config import IsthmusConfig
from broker.control.gate import UnavailableBackend
from broker.control.lease import LeaderLease
from broker.control.plane import ControlParams, ControlPlane
from broker.control.runtime import Intervals, Runtime
from broker.domain.spec import BackendKind
from broker.store.db import Database

log = logging.getLogger("isthmus.control")


def check_backends(config: IsthmusConfig) -> list[str]:
    """Problems with the backends' settings and their pools, one line each, naming the path
    (`backends[1].settings.kubeconfg: unknown k8s backend setting; did you mean ...`)."""
    problems: list[str] = []
    for i, b in enumerate(config.backends):
        try:
            importlib.import_module(f"backends.{b.kind.value}")
        except ImportError as exc:
            problems.append(f"backends[{i}].kind: the {b.kind.value} adapter cannot be "
                            f"loaded ({exc})")
            continue
        check = check_for(b.kind.value)
        if check is not None:
            problems += [f"{path}: {msg}" for path, msg in check(config, i)]
    return problems


def build_backends(config: IsthmusConfig) -> dict[str, Backend]:
    """One adapter per configured backend. One that cannot be built (its settings passed
    `check_backends`, so: a missing client library, say) is replaced by a stand-in that
    reports the error on every call: its pools stay in the inventory as unavailable and its
    jobs wait with BackendUnavailable saying why."""
    out: dict[str, Backend] = {}
    for b in config.backends:
        pools = [p for p in config.pools if p.backend == b.name]
        if b.kind is BackendKind.SIM and not b.settings.get("progress_url"):
            # simulated jobs report progress to this broker unless told otherwise
            b = b.model_copy(update={"settings": {**b.settings, "progress_url": own_url(config)}})
        try:
            importlib.import_module(f"backends.{b.kind.value}")
            out[b.name] = factory_for(b.kind.value)(b, pools)
        except Exception as exc:
            log.error("backend %s (%s) is not available: %s", b.name, b.kind.value, exc)
            out[b.name] = UnavailableBackend(b.name, b.kind.value, str(exc))
    return out


def own_url(config: IsthmusConfig) -> str:
    """The URL of this broker's listener, as a process on the same host reaches it."""
    host = config.server.host
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - a wildcard listener is reached on loopback
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{config.server.port}"


def control_params(config: IsthmusConfig) -> ControlParams:
    c = config.control
    return ControlParams(
        lost_grace_s=c.lost_grace, inventory_wait_s=c.inventory_wait,
        inventory_max_age_s=c.inventory_max_age, observe_timeout_s=c.observe_timeout,
        lock_wait_s=c.backend_lock_wait,
        preemption_min_runtime_s=c.preemption_min_runtime,
        preemption_protect_near_end_s=c.preemption_protect_near_end,
    )


def build_runtime(config: IsthmusConfig, db: Database) -> Runtime:
    c = config.control
    plane = ControlPlane(db, config, build_backends(config), params=control_params(config))
    lease = LeaderLease(db, ttl=c.lease_ttl)
    intervals = Intervals(
        admission=c.admission_interval, dispatch=c.dispatch_interval,
        reconcile=c.reconcile_interval, lease_ttl=c.lease_ttl,
    )
    return Runtime(plane, lease, intervals)
