"""Where priority preemption must stop work for a gang to fit: per domain of a pool (at the
job's required topology level), the cheapest lower-priority jobs whose end lets every replica
find `gpus_per_replica` GPUs on one node inside that domain. Pure; used by policies.preemption.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from policies.types import PendingJob, PoolRoom, RunningJob


@dataclass(frozen=True, slots=True)
class DomainPlan:
    domain: str
    victims: list[RunningJob]
    lost: float

    def key(self) -> tuple[float, int, str]:
        return (round(self.lost, 9), len(self.victims), self.domain)


def best_domain(
    job: PendingJob,
    eligible: list[RunningJob],
    room: PoolRoom,
    max_victims: int,
    lost: Callable[[RunningJob], float],
) -> tuple[DomainPlan | None, bool]:
    """The domain whose plan loses the least work (then fewest victims, then name), or None;
    also whether some eligible jobs could not be located for lack of a node list.
    `eligible` is in preemption order (cheapest first)."""
    by_domain, unlocated = _by_domain(eligible, room, lost)
    best: DomainPlan | None = None
    base = _replicas_by_domain(room, job.gpus_per_replica)
    for domain in sorted(by_domain):
        plan = _fit_domain(job, domain, base.get(domain, 0), by_domain[domain], room,
                           max_victims)
        if plan is not None and (best is None or plan.key() < best.key()):
            best = plan
    return best, unlocated


@dataclass(slots=True)
class _Candidate:
    job: RunningJob
    freed: dict[str, int]
    """GPUs it frees per usable node."""
    lost: float


def _by_domain(
    eligible: list[RunningJob], room: PoolRoom, lost: Callable[[RunningJob], float]
) -> tuple[dict[str, list[_Candidate]], bool]:
    """Eligible jobs (cheapest first) grouped by the one domain holding all their nodes; also
    whether some could not be located for lack of a node list."""
    out: dict[str, list[_Candidate]] = {}
    unlocated = False
    for r in eligible:
        if not r.nodes:
            unlocated = True
            continue
        domains = {room.domain.get(n) for n in r.nodes}
        if len(domains) != 1:
            continue  # spans domains: stopping it frees room in none of them
        domain = domains.pop()
        freed = _freed(r, room)
        if domain is None or not freed:
            continue
        out.setdefault(domain, []).append(_Candidate(r, freed, lost(r)))
    return out, unlocated


def _freed(r: RunningJob, room: PoolRoom) -> dict[str, int]:
    """GPUs `r` frees per usable node: its node list has one entry per replica (or per node),
    each worth gpus / len(nodes)."""
    per_entry = r.gpus // len(r.nodes)
    out: dict[str, int] = {}
    if per_entry:
        for n in r.nodes:
            if n in room.free:
                out[n] = out.get(n, 0) + per_entry
    return out


def _replicas_by_domain(room: PoolRoom, g: int) -> dict[str, int]:
    """Replicas of `g` GPUs each domain holds now."""
    out: dict[str, int] = {}
    for n, free in room.free.items():
        d = room.domain.get(n)
        if d is not None:
            out[d] = out.get(d, 0) + free // g
    return out


def _fit_domain(
    job: PendingJob,
    domain: str,
    replicas_now: int,
    cands: list[_Candidate],
    room: PoolRoom,
    max_victims: int,
) -> DomainPlan | None:
    """Victims in `domain`, cheapest first, until the gang fits; then the unnecessary ones
    are dropped again, the costliest first. None when the gang cannot be made to fit."""
    g, need = job.gpus_per_replica, job.replicas
    if replicas_now >= need:
        return None  # GPUs are not what it lacks here (CPU, memory): stopping jobs won't do
    extra: dict[str, int] = {}
    fits = replicas_now
    chosen: list[_Candidate] = []
    for c in cands:
        if fits >= need or len(chosen) >= max_victims:
            break
        chosen.append(c)
        fits += _gain(extra, c.freed, room, g, 1)
    if fits < need:
        return None
    for c in sorted(chosen, key=lambda c: (-c.lost, c.job.id)):
        loss = _gain(extra, c.freed, room, g, -1)
        if fits + loss >= need:
            fits += loss
            chosen.remove(c)
        else:
            _gain(extra, c.freed, room, g, 1)
    return DomainPlan(domain, [c.job for c in chosen], sum(c.lost for c in chosen))


def _gain(extra: dict[str, int], freed: dict[str, int], room: PoolRoom, g: int, sign: int) -> int:
    """Add (sign 1) or remove (sign -1) one victim's freed GPUs to `extra`; the change in the
    replicas of `g` GPUs its nodes hold."""
    delta = 0
    for n, gpus in freed.items():
        free, size = room.free[n], room.size.get(n, room.free[n])
        before = min(size, free + extra.get(n, 0)) // g
        extra[n] = extra.get(n, 0) + sign * gpus
        delta += min(size, free + extra[n]) // g - before
    return delta
