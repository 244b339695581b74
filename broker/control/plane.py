"""The control plane's shared state: database, configuration, backends, clock, leader epoch.

The admission cycle, dispatcher and reconcilers are functions of a ControlPlane; the runtime
(runtime.py) schedules them. Everything here recovers from the database and from backend
facts, never from memory: the caches below only save parsing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from backends.base import Backend, BackendUnavailable
from broker.config import IsthmusConfig
from broker.domain.inventory import InventorySnapshot, PoolSnapshot
from broker.domain.spec import JobSpec
from broker.store.db import Database
from broker.store.pools import pool_states
from broker.store.tables import utcnow

log = logging.getLogger("isthmus.control")


@dataclass
class ControlParams:
    fair_share_half_life_s: float = 3600.0
    """Half-life of the usage history that fair share weighs."""
    lost_grace_s: float = 120.0
    """An attempt missing from its backend (queue and accounting) this long is lost."""
    cancel_grace_s: int | None = None
    """Grace for cancelling; None: the job's checkpoint grace."""


@dataclass
class ControlPlane:
    db: Database
    config: IsthmusConfig
    backends: Mapping[str, Backend]
    clock: Callable[[], datetime] = utcnow
    params: ControlParams = field(default_factory=ControlParams)
    epoch: int = 0
    _specs: dict[str, JobSpec] = field(default_factory=dict, repr=False)
    # Fair-share history: soft state. After a restart or a hand-over it starts again from
    # the current usage, which only makes fair share briefly less far-sighted.
    _decayed: dict[tuple[str, str], float] = field(default_factory=dict, repr=False)
    _decayed_at: datetime | None = field(default=None, repr=False)

    def decayed_usage(
        self, in_use: Mapping[tuple[str, str], int], now: datetime
    ) -> dict[tuple[str, str], float]:
        """Fold current usage into the decayed history and return it."""
        from policies.types import decay_usage

        elapsed = 0.0 if self._decayed_at is None else (now - self._decayed_at).total_seconds()
        keys = set(self._decayed) | set(in_use)
        if self._decayed_at is None:
            self._decayed = {k: float(in_use.get(k, 0)) for k in keys}
        else:
            self._decayed = {
                k: decay_usage(self._decayed.get(k, 0.0), in_use.get(k, 0), elapsed,
                               self.params.fair_share_half_life_s)
                for k in keys
            }
        self._decayed_at = now
        return dict(self._decayed)

    def spec(self, job_id: str, spec_json: str) -> JobSpec:
        spec = self._specs.get(job_id)
        if spec is None:
            spec = self._specs[job_id] = JobSpec.model_validate_json(spec_json)
        return spec

    def inventory(self) -> InventorySnapshot:
        """One snapshot across all backends, pools as configured (drain from config too).

        A backend that cannot be reached is listed as unreachable; its pools are absent, so
        admission waits with BackendUnavailable instead of guessing."""
        pools: list[PoolSnapshot] = []
        unreachable: list[str] = []
        configured = {p.name: p for p in self.config.pools}
        with self.db.read() as s:
            admin = pool_states(s)
        for name, backend in self.backends.items():
            try:
                snap = backend.inventory()
            except BackendUnavailable as exc:
                log.warning("backend %s unreachable for inventory: %s", name, exc)
                unreachable.append(name)
                continue
            for pool in snap.pools:
                cfg = configured.get(pool.name)
                if cfg is None or cfg.backend != name:
                    continue  # not an Isthmus pool
                pools.append(
                    pool.model_copy(
                        update={
                            "drained": pool.drained or cfg.drained or (
                                pool.name in admin and admin[pool.name].drained
                            ),
                            "cost_weight": cfg.cost_weight,
                            "shared": cfg.shared,
                            "flavor": cfg.flavor,
                        }
                    )
                )
        return InventorySnapshot(
            taken_at=self.clock(), pools=tuple(pools), unreachable=tuple(unreachable)
        )


def hold_in_flight(
    inventory: InventorySnapshot, held: Mapping[tuple[str, str], int]
) -> InventorySnapshot:
    """Subtract GPUs promised to admitted attempts that the backend has not shown yet (their
    intent is not dispatched, or nothing was observed since): without this, the next cycle
    would see those nodes free and place a second gang on them."""
    if not held:
        return inventory
    pools = []
    for pool in inventory.pools:
        nodes = tuple(
            n.model_copy(update={"free_gpus": max(0, n.free_gpus - held[(pool.name, n.name)])})
            if (pool.name, n.name) in held else n
            for n in pool.nodes
        )
        pools.append(pool.model_copy(update={"nodes": nodes}))
    return inventory.model_copy(update={"pools": tuple(pools)})
