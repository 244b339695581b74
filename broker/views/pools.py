"""Pool view: capacity, free, who holds what, queues, drain, reachability, fragmentation.

`pool_views` is pure (configuration, admin drain state, the backends' last answers and the
Isthmus GPUs per pool in; one `PoolView` per configured pool out). `read_pools` gathers those
inputs from the store and the control plane's inventory cache: it never calls a backend, so a
view costs one query however slow the backends are. Without a control plane in this process
(or before its first cycle) pools show their configured shape with `reachable` False.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from pydantic import BaseModel

from broker.config import IsthmusConfig
from broker.config import Pool as PoolConfig
from broker.control.inventories import Answer
from broker.domain.inventory import PoolSnapshot
from broker.store.db import Database
from broker.store.pools import PoolState, pool_states
from broker.store.reports import live_gpus_by_pool


class DomainView(BaseModel):
    """One topology domain (a rack, or a block of racks) of a pool."""

    name: str
    """'block/rack' for a rack, 'block' for a block ('' when the backend reports none)."""
    nodes: int
    total_gpus: int
    free_gpus: int
    """GPUs free on schedulable nodes."""
    largest_free_node: int
    """Most GPUs free on one schedulable node: the largest replica that fits without waiting."""


class PoolView(BaseModel):
    name: str
    backend: str
    flavor: str
    cost_weight: float
    capacity_gpus: int
    """GPUs on the pool's nodes (the configured shape when no inventory is known)."""
    free_gpus: int
    """Free GPUs on schedulable nodes."""
    unschedulable_gpus: int
    """GPUs on nodes that are drained or down in the backend."""
    isthmus_gpus: int
    """GPUs Isthmus attempts hold on the nodes (ranks starting or running) that the backend
    reports busy: with free, foreign and unschedulable it adds up to the capacity."""
    isthmus_unseen_gpus: int = 0
    """GPUs of attempts the store places in the pool but the backend's nodes show free: a
    backend that lost its jobs (a restarted simulator, a wiped cluster) until reconciliation
    ends those attempts."""
    isthmus_waiting_gpus: int
    """GPUs of admitted Isthmus attempts not placed on nodes yet."""
    foreign_gpus: int
    """Busy GPUs not held by Isthmus: work the backend runs for others."""
    queued_isthmus_gpus: int
    """GPUs of Isthmus jobs pending in the backend's queue for this pool."""
    queued_foreign_gpus: int
    """GPUs other users' jobs wait for in the backend's own queue."""
    drained: bool
    drained_in_config: bool
    drained_by: str | None
    drain_reason: str
    drained_at: datetime | None
    reachable: bool
    """The backend's last inventory call succeeded."""
    note: str
    """Why it is not reachable, or '' (the last error and since when)."""
    inventory_at: datetime | None
    inventory_age_s: float | None
    racks: list[DomainView]
    blocks: list[DomainView]
    largest_free_rack: int
    largest_free_block: int
    largest_free_node: int


def _domains(pool: PoolSnapshot, level: str) -> list[DomainView]:
    acc: dict[str, list[int]] = {}
    for n in pool.nodes:
        name = n.topology.domain(level, n.name)
        nodes, total, free, node_max = acc.setdefault(name, [0, 0, 0, 0])
        free_here = n.free_gpus if n.schedulable else 0
        acc[name] = [nodes + 1, total + n.total_gpus, free + free_here, max(node_max, free_here)]
    return [DomainView(name=k, nodes=v[0], total_gpus=v[1], free_gpus=v[2],
                       largest_free_node=v[3]) for k, v in sorted(acc.items())]


def _configured_gpus(cfg: PoolConfig) -> int:
    return cfg.capacity.nodes * cfg.capacity.gpus_per_node if cfg.capacity else 0


def pool_view(
    cfg: PoolConfig, state: PoolState | None, answer: Answer | None,
    held: tuple[int, int], now: datetime,
) -> PoolView:
    """One pool's view (pure). `answer`: its backend's last answer (None: never asked);
    `held`: (placed, waiting) Isthmus GPUs in the pool."""
    snap = answer.snapshot.pool(cfg.name) if answer and answer.snapshot else None
    reachable = answer is not None and answer.snapshot is not None and not answer.note
    note = "" if reachable else (
        answer.note if answer and answer.note else f"no inventory of backend {cfg.backend} yet")
    if answer is not None and answer.snapshot is not None and snap is None and reachable:
        reachable, note = False, f"backend {cfg.backend} reports no pool {cfg.name}"
    placed, waiting = held
    unseen = 0
    if snap is not None:
        capacity = snap.total_gpus
        free = snap.free_gpus
        unschedulable = sum(n.total_gpus for n in snap.nodes if not n.schedulable)
        busy = sum(n.total_gpus - n.free_gpus for n in snap.nodes if n.schedulable)
        # the backend's nodes are the truth of what is held: the store's placements count
        # only as far as the nodes are busy (a restarted simulator showed 32 free plus 16
        # held of 32 GPUs)
        unseen = max(0, placed - busy)
        placed -= unseen
        racks, blocks = _domains(snap, "rack"), _domains(snap, "block")
        queued_ours, queued_foreign = (snap.queue.isthmus_pending_gpus,
                                       snap.queue.foreign_pending_gpus)
    else:
        capacity, free, unschedulable, busy = _configured_gpus(cfg), 0, 0, 0
        racks, blocks, queued_ours, queued_foreign = [], [], 0, 0
    taken = answer.taken_at if answer is not None else None
    return PoolView(
        name=cfg.name, backend=cfg.backend, flavor=cfg.flavor, cost_weight=cfg.cost_weight,
        capacity_gpus=capacity, free_gpus=free, unschedulable_gpus=unschedulable,
        isthmus_gpus=placed, isthmus_unseen_gpus=unseen, isthmus_waiting_gpus=waiting,
        foreign_gpus=max(0, busy - placed),
        queued_isthmus_gpus=queued_ours, queued_foreign_gpus=queued_foreign,
        drained=cfg.drained or bool(state and state.drained), drained_in_config=cfg.drained,
        drained_by=state.actor if state and state.drained else None,
        drain_reason=state.reason if state and state.drained else "",
        drained_at=state.updated_at if state and state.drained else None,
        reachable=reachable, note=note, inventory_at=taken,
        inventory_age_s=max(0.0, (now - taken).total_seconds()) if taken else None,
        racks=racks, blocks=blocks,
        largest_free_rack=max((r.free_gpus for r in racks), default=0),
        largest_free_block=max((b.free_gpus for b in blocks), default=0),
        largest_free_node=max((r.largest_free_node for r in racks), default=0),
    )


def pool_views(
    config: IsthmusConfig, states: Mapping[str, PoolState], answers: Mapping[str, Answer],
    held: Mapping[str, tuple[int, int]], now: datetime,
) -> list[PoolView]:
    """Every configured pool, in configuration order (pure)."""
    return [
        pool_view(p, states.get(p.name), answers.get(p.backend), held.get(p.name, (0, 0)), now)
        for p in config.pools
    ]


def read_pools(
    config: IsthmusConfig, db: Database, answers: Mapping[str, Answer], now: datetime
) -> list[PoolView]:
    """The pool views from the store and the backends' last answers (see module doc)."""
    with db.read() as s:
        states = pool_states(s)
        held = live_gpus_by_pool(s)
    return pool_views(config, states, answers, held, now)
