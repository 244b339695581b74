"""The pool as priority preemption sees it for a job (policies/cycle.py): free GPUs per
node on the cycle's working copy and each node's domain at the job's required level."""

from __future__ import annotations

from policies.capacity import LEVEL_NAMES, PoolIndex, domain_name
from policies.types import PoolRoom


def node_domains(pool: PoolIndex, level: int) -> dict[str, str]:
    return {n: domain_name(s, level) for n, s in pool.nodes.items()}


def pool_room(
    pool: PoolIndex,
    level: int,
    exclude: frozenset[str] = frozenset(),
    domains: dict[str, str] | None = None,
) -> PoolRoom:
    """The pool as priority preemption sees it for a job: the free GPUs now (the working copy,
    after this cycle's admissions and holds) of each schedulable node not in `exclude`, and
    the domain of each node at `level`."""
    usable = [s for s in pool.nodes.values() if s.total and s.name not in exclude]
    return PoolRoom(
        LEVEL_NAMES[level],
        node_domains(pool, level) if domains is None else domains,
        {s.name: s.free for s in usable},
        {s.name: s.total for s in usable},
    )
