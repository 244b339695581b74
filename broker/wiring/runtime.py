"""Builds the control loop from isthmus.yaml: backend adapters (adapters.py), the control
plane with the policies' parameters, the lease and the runtime; and checks the backends'
settings with the same per-kind translation the adapters are built with (`isthmus config
check` and the server start both call `check_backends`, so the server never starts on a file
the check refuses).

broker/config.py stays free of backend imports: it knows a backend's kind and its settings as
a mapping; what the settings of each kind mean is the adapter package's business, and the
translation between the two is this package's."""

from __future__ import annotations

from typing import Any

from backends.base import Backend
from broker.config import IsthmusConfig, Policies
from broker.control.gate import UnavailableBackend
from broker.control.lease import LeaderLease
from broker.control.plane import ControlParams, ControlPlane
from broker.control.runtime import Intervals, Runtime
from broker.domain.spec import BackendKind
from broker.logs import get_logger
from broker.store.db import Database
from broker.wiring.adapters import adapter_problems, build_adapter
from policies.cycle import AdmissionParams
from policies.ordering import OrderingParams
from policies.placement import PlacementParams, ScoreWeights
from policies.preemption import PreemptionParams
from policies.retry import RetryParams

log = get_logger(__name__)


def check_backends(config: IsthmusConfig) -> list[str]:
    """Problems with the backends' settings and their pools, one line each, naming the path
    (`backends[1].settings.kubeconfg: unknown k8s backend setting; did you mean ...`)."""
    problems: list[str] = []
    for i, b in enumerate(config.backends):
        try:
            problems += [f"{path}: {msg}" for path, msg in adapter_problems(config, i)]
        except ImportError as exc:
            problems.append(f"backends[{i}].kind: the {b.kind.value} adapter cannot be "
                            f"loaded ({exc})")
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
            out[b.name] = build_adapter(b, pools)
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
    c, p = config.control, config.policies
    return ControlParams(
        lost_grace_s=c.lost_grace, inventory_wait_s=c.inventory_wait,
        inventory_max_age_s=c.inventory_max_age, observe_timeout_s=c.observe_timeout,
        lock_wait_s=c.backend_lock_wait,
        fair_share_half_life_s=p.fair_share.half_life, cancel_grace_s=p.cancel_grace,
        **policy_params(p),
    )


def policy_params(p: Policies) -> dict[str, Any]:
    """The `policies:` section as the pure policies' parameter objects (the older
    `control.preemption_*` keys are folded into it when the configuration is read)."""
    w, pl, o = p.placement.weights, p.placement, p.ordering
    return {
        "admission": AdmissionParams(
            placement=PlacementParams(
                weights=ScoreWeights(
                    flavor=w.flavor, topology=w.topology, preferred_miss=w.preferred_miss,
                    wait_per_hour=w.wait_per_hour, fragmentation=w.fragmentation,
                    cost=w.cost, queued=w.queued, foreign_wait=w.foreign_wait,
                ),
                turnover_seconds=pl.turnover,
                default_max_isthmus_pending=pl.max_isthmus_pending,
                queue_max_gpus=pl.queue_max_gpus,
                hold_queued_by_shape=pl.hold_queued_by_shape,
            ),
            ordering=OrderingParams(
                starvation_after_s=o.starvation_after,
                reservation_min_gpus=o.reservation_min_gpus,
                max_reservations=o.max_reservations,
                queue_closed_after_s=o.queue_closed_after,
                queue_exclude=o.queue_exclude,
                backfill=o.backfill,
                backfill_margin_s=o.backfill_margin,
            ),
            max_admissions=p.admission.max_admissions,
        ),
        "preemption": PreemptionParams(
            min_runtime_s=p.preemption.min_runtime,
            protect_near_end_s=p.preemption.protect_near_end,
            max_victims=p.preemption.max_victims,
        ),
        "retry": RetryParams(
            max_preemptions=p.retry.max_preemptions,
            orchestration_retries=p.retry.orchestration_retries,
            unknown_retries=p.retry.unknown_retries,
            preemption_delay_s=p.retry.preemption_delay,
            infra_pool_exclude_after=p.retry.infra_pool_exclude_after,
        ),
    }


def build_runtime(config: IsthmusConfig, db: Database) -> Runtime:
    c = config.control
    plane = ControlPlane(db, config, build_backends(config), params=control_params(config))
    lease = LeaderLease(db, ttl=c.lease_ttl)
    intervals = Intervals(
        admission=c.admission_interval, dispatch=c.dispatch_interval,
        reconcile=c.reconcile_interval, lease_ttl=c.lease_ttl,
        notices=config.notices.interval,
    )
    return Runtime(plane, lease, intervals)
