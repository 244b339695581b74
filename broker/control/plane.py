"""The control plane's shared state: database, configuration, backends, clock, leader epoch.

The admission cycle, dispatcher and reconcilers are functions of a ControlPlane; the runtime
(runtime.py) schedules them. Everything here recovers from the database and from backend
facts, never from memory: the caches below only save parsing, and the inventory cache
(inventories.py) only bridges a backend that answers late.

Every backend is reached through a GatedBackend (gate.py): one call at a time per adapter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Session

from backends.base import Backend
from broker.config import IsthmusConfig
from broker.config import Pool as PoolConfig
from broker.control.gate import GatedBackend
from broker.control.inventories import Answer, Inventories
from broker.control.soft_state import SoftState
from broker.domain.attempts import RunSnapshot
from broker.domain.clock import utcnow
from broker.domain.inventory import InventorySnapshot, NodeSnapshot, PoolSnapshot, TopologyPath
from broker.domain.spec import BackendKind, JobSpec
from broker.domain.states import TERMINAL
from broker.logs import get_logger
from broker.orchestration import notice_rule
from broker.store import attempts as att
from broker.store.db import Database
from broker.store.db_clock import db_now
from broker.store.fence import FencedDatabase
from broker.store.pools import PoolState, pool_states
from broker.store.records import JobRecord
from policies.cycle import AdmissionParams
from policies.preemption import PreemptionParams
from policies.retry import RetryParams
from policies.types import FAIR_SHARE_HALF_LIFE_S

K = TypeVar("K")
M = TypeVar("M", bound=BaseModel)

log = get_logger(__name__)


@dataclass
class ControlParams:
    fair_share_half_life_s: float = FAIR_SHARE_HALF_LIFE_S
    """Half-life of the usage history that fair share weighs."""
    lost_grace_s: float = 120.0
    """An attempt missing from its backend (queue and accounting) this long is lost."""
    cancel_grace_s: int | None = None
    """Grace for cancelling; None: the job's checkpoint grace."""
    inventory_wait_s: float = 1.0
    """An admission cycle waits this long for all backends' inventories (asked at once)."""
    inventory_max_age_s: float = 60.0
    """A slow backend's last good inventory is served up to this old, then it is unavailable."""
    observe_timeout_s: float = 60.0
    """A reconciler's observe call times out after this (BackendUnavailable)."""
    lock_wait_s: float = 10.0
    """submit, lookup and cancel wait this long for an adapter busy with another call."""
    admission: AdmissionParams = field(default_factory=AdmissionParams)
    """Placement, ordering (starvation) and per-cycle limits of the admission policy."""
    preemption: PreemptionParams = field(default_factory=PreemptionParams)
    retry: RetryParams = field(default_factory=RetryParams)


@dataclass
class ControlPlane:
    db: Database
    config: IsthmusConfig
    backends: Mapping[str, Backend]
    clock: Callable[[], datetime] = utcnow
    period_clock: Callable[[sa.Connection], datetime] = db_now
    """What GPU-hour budget periods roll over by: the database's clock (tests inject one)."""
    params: ControlParams = field(default_factory=ControlParams)
    epoch: int = 0
    soft: SoftState = field(default_factory=SoftState, repr=False)
    """What the leader keeps between passes (broker.control.soft_state: each cache's owner
    and bound)."""
    _inventories: Inventories = field(init=False, repr=False)
    _gates: dict[str, GatedBackend] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        notice_rule.watch_teams(t.name for t in self.config.teams if t.notices is not None)
        self.backends = {name: self._wrap(b) for name, b in self.backends.items()}
        self._inventories = Inventories(
            lambda: self.clock(), self.params.inventory_wait_s, self.params.inventory_max_age_s
        )

    def _wrap(self, backend: Backend) -> GatedBackend:
        if isinstance(backend, GatedBackend):
            return backend
        return GatedBackend(backend, lock_wait=self.params.lock_wait_s,
                            observe_timeout=self.params.observe_timeout_s)

    def fence(self, lease: str) -> None:
        """From now on every write of the control loop (through `self.db`) commits only while
        the lease `lease` is at this plane's epoch (store/fence.py); a deposed leader's writes
        raise Deposed and are rolled back. The API keeps its own, unfenced, database handle."""
        if not isinstance(self.db, FencedDatabase):
            self.db = FencedDatabase.over(self.db, lease, lambda: self.epoch)

    def gate(self, name: str) -> GatedBackend:
        """The gated adapter of a backend (also when `backends` was replaced after start)."""
        backend = self.backends[name]
        if isinstance(backend, GatedBackend):
            return backend
        gate = self._gates.get(name)
        if gate is None or gate.inner is not backend:
            gate = self._gates[name] = self._wrap(backend)
        return gate

    def decayed_usage(
        self, in_use: Mapping[tuple[str, str], int], now: datetime
    ) -> dict[tuple[str, str], float]:
        """Recent GPUs in use per (team, flavor): the exponentially weighted average over the
        ledger's reservations (reserve .. release, or now while held), each instant weighing
        half as much per `fair_share_half_life_s` of age. Derived from the ledger on every
        call, so a restart or a hand-over sees the same history. `in_use` adds the keys of
        reservations without history (weight 0 until time passes)."""
        with self.db.read() as s:
            out = decayed_from_ledger(s, now, self.params.fair_share_half_life_s)
        for key in in_use:
            out.setdefault(key, 0.0)
        return out

    def spec(self, job_id: str, spec_json: str, *, keep: bool = True) -> JobSpec:
        """The job's stored spec, parsed (kept: SoftState.specs). A reader of jobs that have
        ended (`keep=False`) parses without keeping: only live jobs' specs are read again."""
        return self._parsed(self.soft.specs, job_id, spec_json, JobSpec, keep=keep)

    def snapshot(self, a: att.AttemptRecord, *, keep: bool = False,
                 last: bool = False) -> RunSnapshot:
        """The attempt's stored run snapshot, parsed, or as kept (SoftState.snapshots):
        `keep` it for a later reader, or take it out as its `last` reader."""
        return self._parsed(self.soft.snapshots, (a.job_id, a.number), a.snapshot_json,
                            RunSnapshot, keep=keep, last=last)

    def _parsed(self, cache: MutableMapping[K, M], key: K, text: str, model: type[M], *,
                keep: bool, last: bool = False) -> M:
        """`text` parsed as `model`, or as `cache` keeps it under `key` (taken out when
        `last`; kept once parsed when `keep`), the cache used under SoftState.lock only (the
        parse outside it)."""
        lock = self.soft.lock
        with lock:
            kept = cache.pop(key, None) if last else cache.get(key)
        if kept is not None:
            return kept
        parsed = model.model_validate_json(text)
        if keep:
            with lock:
                cache[key] = parsed
        return parsed

    def forget_specs(self, jobs: Iterable[JobRecord]) -> None:
        """Drops the kept specs and run snapshots of `jobs` that have ended (read again,
        should one be retried by hand: a parse)."""
        soft = self.soft
        ended = [job for job in jobs if job.state in TERMINAL]
        if not ended:
            return
        with soft.lock:
            for job in ended:
                soft.specs.pop(job.id, None)
                for number in range(1, job.attempt + 1):
                    soft.snapshots.pop((job.id, number), None)

    def last_inventories(self) -> dict[str, Answer]:
        """Each backend's last answer, without asking it (inventories.Inventories.peek)."""
        return self._inventories.peek()

    def inventory(self, admin: Mapping[str, PoolState] | None = None) -> InventorySnapshot:
        """One snapshot across all backends, pools as configured (drain from config too).
        `admin`: the pools' drain states as the caller read them just before (the admission
        cycle, in its own read), else read here.

        Backends are asked at once and waited for at most `inventory_wait_s` (inventories.py),
        so a slow one delays the others by that much at most. The pools of a backend that
        cannot be used stay in the snapshot with their configured shape, marked unavailable
        (and the backend listed as unreachable): their jobs wait with BackendUnavailable naming
        the backend, the error and since when, not with NoFlavorFits."""
        answers = self._inventories.gather({name: self.gate(name) for name in self.backends})
        for b in self.config.backends:  # configured, but no adapter at all
            if b.name not in answers:
                answers[b.name] = Answer(None, f"backend {b.name} has no adapter")
        configured = {p.name: p for p in self.config.pools}
        stale = {n: a.taken_at for n, a in answers.items() if a.stale and a.taken_at}
        late: list[att.AttemptRecord] = []
        if admin is None or stale:
            with self.db.read() as s:
                admin = pool_states(s) if admin is None else admin
                late = [a for n, at in stale.items() for a in att.live(s, n)
                        if a.created_at >= at]

        def drained(name: str, flag: bool = False) -> bool:
            cfg = configured.get(name)
            return flag or bool(cfg and cfg.drained) or (name in admin and admin[name].drained)

        pools: list[PoolSnapshot] = []
        unreachable: list[str] = []
        for name, answer in answers.items():
            if answer.snapshot is None:
                unreachable.append(name)
                pools += [
                    unavailable_pool(cfg, self._kind(name), answer.note, drained(cfg.name))
                    for cfg in self.config.pools if cfg.backend == name
                ]
                continue
            for pool in answer.snapshot.pools:
                cfg = configured.get(pool.name)
                if cfg is None or cfg.backend != name:
                    continue  # not an Isthmus pool
                pools.append(
                    pool.model_copy(
                        update={
                            "drained": drained(pool.name, pool.drained),
                            "cost_weight": cfg.cost_weight,
                            "shared": cfg.shared,
                            "flavor": cfg.flavor,
                            "stale": answer.note or None,
                        }
                    )
                )
        snapshot = InventorySnapshot(
            taken_at=self.clock(), pools=tuple(pools), unreachable=tuple(unreachable)
        )
        return hold_in_flight(snapshot, _seen_since(late))

    def _kind(self, name: str) -> BackendKind:
        cfg = self.config.backend(name)
        if cfg is not None:
            return cfg.serves_as
        return BackendKind(self.backends[name].kind)


HISTORY_HALF_LIVES = 20
"""Reservations released longer ago than this many half-lives weigh under a millionth: left out."""


def decayed_from_ledger(
    s: Session, now: datetime, half_life_s: float
) -> dict[tuple[str, str], float]:
    """The decayed average of GPUs reserved per (team, flavor) at `now`, from the ledger's
    reserve and release entries: a reservation of g GPUs held over [start, end] adds
    g x (2^-(now-end)/h - 2^-(now-start)/h), its share of the average."""
    from broker.ledger import LedgerKind
    from broker.store.tables import LEDGER_ENTRIES as LEDGER

    rel = LEDGER.alias("rel")
    horizon = now - timedelta(seconds=half_life_s * HISTORY_HALF_LIVES)
    rows = s.connection().execute(
        sa.select(LEDGER.c.team, LEDGER.c.flavor, LEDGER.c.gpus, LEDGER.c.at, rel.c.at)
        .select_from(LEDGER.outerjoin(rel, sa.and_(
            rel.c.job_id == LEDGER.c.job_id, rel.c.attempt == LEDGER.c.attempt,
            rel.c.kind == LedgerKind.RELEASE.value,
        )))
        .where(LEDGER.c.kind == LedgerKind.RESERVE.value,
               sa.or_(rel.c.at.is_(None), rel.c.at >= horizon))
    )
    out: dict[tuple[str, str], float] = {}
    t_now = now.timestamp()
    # per-row work in floats: this runs every cycle over every reservation of the horizon
    rate = math.log(2) / half_life_s if half_life_s > 0 else 0.0
    for team, flavor, gpus, start, end in rows:
        t_end = min(end.timestamp(), t_now) if end is not None else t_now
        t_start = min(start.timestamp(), t_end)
        if half_life_s <= 0:
            share = float(gpus) if t_end >= t_now else 0.0
        else:
            share = gpus * (math.exp(-rate * (t_now - t_end)) - math.exp(-rate * (t_now - t_start)))
        out[(team, flavor)] = out.get((team, flavor), 0.0) + share
    return out


def _seen_since(late: list[att.AttemptRecord]) -> dict[tuple[str, str], int]:
    """GPUs per (pool, node) of attempts created after a stale inventory was taken that the
    admission cycle does not hold already (it holds those the backend has not shown yet): the
    stale snapshot cannot show any of them, and without this their nodes would look free.
    One seen but still starting is held by admission too (att.unseen): counted twice while
    the snapshot is stale, which only keeps its nodes busy (free GPUs stop at 0)."""
    held: dict[tuple[str, str], int] = {}
    for a in late:
        if a.dispatch == att.CREATED and a.last_seen_at is not None:
            add_placed_gpus(held, a)
    return held


def add_placed_gpus(held: dict[tuple[str, str], int], a: att.AttemptRecord) -> None:
    """Add an attempt's GPUs to `held` per (pool, node) of its placement (which names a node
    once per replica); an attempt placed by the backend itself names no nodes."""
    placement = RunSnapshot.model_validate_json(a.snapshot_json).placement
    if placement is None or not placement.nodes:
        return
    per_replica = a.gpus // len(placement.nodes)
    for node in placement.nodes:
        held[(a.pool, node)] = held.get((a.pool, node), 0) + per_replica


def unavailable_pool(cfg: PoolConfig, kind: BackendKind, why: str,
                     drained: bool) -> PoolSnapshot:
    """A configured pool whose backend cannot be used now: its static shape from isthmus.yaml
    (when given), every node unschedulable, and the reason."""
    nodes: list[NodeSnapshot] = []
    cap = cfg.capacity
    if cap is not None:
        per_rack = cap.nodes_per_rack or cap.nodes
        per_block = cap.racks_per_block or 1
        for i in range(cap.nodes):
            rack = i // per_rack
            nodes.append(NodeSnapshot(
                name=f"{cfg.name}-static-{i}", total_gpus=cap.gpus_per_node, free_gpus=0,
                topology=TopologyPath(block=f"b{rack // per_block}", rack=f"r{rack}"),
                schedulable=False, reason="backend unavailable",
            ))
    selector = cfg.partition or ",".join(f"{k}={v}" for k, v in sorted(cfg.node_selector.items()))
    return PoolSnapshot(
        name=cfg.name, backend_kind=kind, backend=cfg.backend, flavor=cfg.flavor,
        selector=selector, cost_weight=cfg.cost_weight, shared=cfg.shared, drained=drained,
        nodes=tuple(nodes), unavailable=why,
    )


def hold_in_flight(
    inventory: InventorySnapshot, held: Mapping[tuple[str, str], int]
) -> InventorySnapshot:
    """Subtract GPUs promised to admitted attempts that the backend has not shown yet (their
    intent is not dispatched, or nothing was observed since): without this, the next cycle
    would see those nodes free and place a second gang on them."""
    if not held:
        return inventory
    by_pool: dict[str, dict[str, int]] = {}
    for (pool_name, node), gpus in held.items():
        by_pool.setdefault(pool_name, {})[node] = gpus
    pools = []
    for pool in inventory.pools:
        mine = by_pool.get(pool.name)
        if not mine:  # nothing promised here: the pool as the backend showed it
            pools.append(pool)
            continue
        nodes = tuple(
            n.model_copy(update={"free_gpus": max(0, n.free_gpus - mine[n.name])})
            if n.name in mine else n
            for n in pool.nodes
        )
        pools.append(pool.model_copy(update={"nodes": nodes}))
    return inventory.model_copy(update={"pools": tuple(pools)})
