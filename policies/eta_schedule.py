"""The projected schedule behind the queue estimate (policies/eta.py): the admission loop played
forward in time over the jobs known now.

State: the free GPUs of every schedulable node, and a heap of the times GPUs come back (the
backends' expected releases, and the predicted ends of the work the projection starts). At
each step (now, then the next release, steps at least `STEP_S` apart, as the real loop admits
once per cycle) the waiting jobs are taken as the real cycle takes them: GPUs owed to work
queued in a backend first, then starving gangs (oldest first), then the rest in the cycle's
admission order; a job whose gang fits now starts (it holds its GPUs until its predicted end),
and a starving gang that does not fit holds the free GPUs of one domain for the step, so that
nothing starts there in front of it. A later job therefore starts before an earlier one
wherever it fits first, as it does in the real loop (greedy, not conservative backfill). Jobs
that arrive later are unknown and not projected.

Pure: the same inputs give the same schedule. Bounded by a work budget (node checks).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

STEP_S = 60.0
"""Releases closer than this to the previous step are taken in the next step."""


@dataclass(slots=True)
class Slot:
    name: str
    total: int
    free: int
    domains: tuple[str, str, str, str]
    """Its domain at node, rack, block and pool level."""


@dataclass(frozen=True, slots=True)
class Wanted:
    """A waiting job as the projection sees it."""

    id: str
    g: int
    replicas: int
    level: int
    run_s: float
    pools: tuple[str, ...]
    """Usable pools, most preferred first."""
    not_before: float
    starving_at: float
    """When it counts as starving (inf: never): it goes first and holds a domain."""
    submitted: float
    exclude: frozenset[str] = frozenset()
    declared_s: float = 0.0
    """Its declared limit: what admission's backfill rule counts (policies/backfill.py)."""

    @property
    def shape(self) -> tuple[int, int, int, tuple[str, ...]]:
        return (self.g, self.replicas, self.level, self.pools)


@dataclass(frozen=True, slots=True)
class Start:
    at: float
    pool: str
    nodes: tuple[str, ...]
    """One entry per replica."""


class PoolState:
    """Free GPUs per node of one pool, with the nodes indexed by how many GPUs they have free."""

    def __init__(self, name: str, slots: Sequence[Slot], unknown_busy: bool) -> None:
        self.name = name
        self.slots = {s.name: s for s in slots}
        self.unknown_busy = unknown_busy
        top = max((s.total for s in slots), default=0)
        self.by_free: list[set[str]] = [set() for _ in range(top + 1)]
        for s in slots:
            self.by_free[s.free].add(s.name)
        self.owed: list[tuple[int, float]] = []
        """(GPUs, run time) owed to work queued in the backend, paid from free GPUs first."""

    def set_free(self, s: Slot, free: int) -> None:
        self.by_free[s.free].discard(s.name)
        s.free = max(0, min(s.total, free))
        self.by_free[s.free].add(s.name)

    def candidates(self, gpus: int, exclude: frozenset[str]) -> list[Slot]:
        """Nodes with at least `gpus` free GPUs, fullest first (best fit), then by name."""
        out: list[Slot] = []
        for f in range(gpus, len(self.by_free)):
            out.extend(self.slots[n] for n in sorted(self.by_free[f]) if n not in exclude)
        return out

    def fit(self, w: Wanted, budget: list[int]) -> list[tuple[Slot, int]] | None:
        """Where the gang fits now in one domain at its level: the tightest such domain (the
        fewest spare replicas), the nodes with the most room for it first."""
        nodes = self.candidates(w.g, w.exclude)
        budget[0] -= len(nodes) + 1
        if w.replicas == 1:
            return [(nodes[0], 1)] if nodes else None
        groups: dict[str, list[tuple[Slot, int]]] = {}
        for s in nodes:
            groups.setdefault(s.domains[w.level], []).append((s, s.free // w.g))
        best: tuple[int, str] | None = None
        for domain, members in groups.items():
            room = sum(k for _, k in members)
            if room >= w.replicas and (best is None or (room, domain) < best):
                best = (room, domain)
        if best is None:
            return None
        picked: list[tuple[Slot, int]] = []
        need = w.replicas
        for s, k in sorted(groups[best[1]], key=lambda m: (-m[1], m[0].name)):
            take = min(k, need)
            picked.append((s, take))
            need -= take
            if not need:
                break
        return picked

    def hold(self, w: Wanted, budget: list[int]) -> tuple[list[tuple[Slot, int]], list[Slot]]:
        """A starving gang's reservation, as admission makes it (policies.capacity): in the
        tightest level that could ever hold the gang, the domain closest to holding it now;
        free GPUs up to the gang's size, the nodes with the most free first. Returns what was
        taken, to be given back after the step."""
        budget[0] -= 2 * len(self.slots) + 1
        groups = self._domains(w)
        if not groups:
            return [], []
        domain = max(groups, key=lambda d: (sum(s.free // w.g for s in groups[d]),
                                            sum(s.free for s in groups[d]), d))
        need = w.replicas * w.g
        out: list[tuple[Slot, int]] = []
        for s in sorted(groups[domain], key=lambda s: (-s.free, s.name)):
            take = min(s.free, need)
            if take <= 0:
                break
            out.append((s, take))
            self.set_free(s, s.free - take)
            need -= take
        return out, groups[domain]

    def _domains(self, w: Wanted) -> dict[str, list[Slot]]:
        """The domains (with their nodes) of the tightest level up to the gang's that could
        hold it when empty; none if no level could."""
        for level in range(w.level + 1):
            groups: dict[str, list[Slot]] = {}
            for s in self.slots.values():
                if s.name not in w.exclude:
                    groups.setdefault(s.domains[level], []).append(s)
            ok = {d: ss for d, ss in groups.items()
                  if sum(s.total // w.g for s in ss) >= w.replicas}
            if ok:
                return ok
        return {}


@dataclass(slots=True)
class Projection:
    pools: dict[str, PoolState]
    now: float
    horizon_s: float
    max_holds: int
    budget: list[int]
    """Node checks left (a list so that pools can spend it)."""
    events: list[tuple[float, int, str, str, int]] = field(default_factory=list)
    _seq: int = 0

    def release(self, t: float, pool: str, node: str, gpus: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, pool, node, gpus))

    def take(self, t: float, run_s: float, pool: PoolState, gpus: int,
             picked: Sequence[tuple[Slot, int]]) -> None:
        for s, k in picked:
            pool.set_free(s, s.free - k * gpus)
            self.release(t + run_s, pool.name, s.name, k * gpus)

    def run(self, waiting: Sequence[Wanted]) -> dict[str, Start]:
        """The start of every waiting job the projection reaches (the others are left out)."""
        out: dict[str, Start] = {}
        left = list(waiting)
        t = self.now
        while left and self.budget[0] > 0 and t - self.now <= self.horizon_s:
            self._absorb(t)
            self._pay_owed(t)
            left = self._step(t, left, out)
            if not left or not self.events:
                break
            t = max(self.events[0][0], t + STEP_S)
        return out

    def _absorb(self, t: float) -> None:
        while self.events and self.events[0][0] <= t:
            _, _, pool, node, gpus = heapq.heappop(self.events)
            p = self.pools[pool]
            s = p.slots[node]
            p.set_free(s, s.free + gpus)

    def _pay_owed(self, t: float) -> None:
        for p in self.pools.values():
            while p.owed and self.budget[0] > 0:
                gpus, run_s = p.owed[0]
                nodes = sorted(p.candidates(1, frozenset()), key=lambda s: (-s.free, s.name))
                self.budget[0] -= len(nodes) + 1
                for s in nodes:
                    k = min(gpus, s.free)
                    self.take(t, run_s, p, 1, [(s, k)])
                    gpus -= k
                    if not gpus:
                        break
                if gpus:
                    p.owed[0] = (gpus, run_s)
                    break
                p.owed.pop(0)

    def _step(self, t: float, left: list[Wanted], out: dict[str, Start]) -> list[Wanted]:
        starving = sorted((w for w in left if w.starving_at <= t),
                          key=lambda w: (w.submitted, w.id))
        order = starving + [w for w in left if w.starving_at > t]
        held: list[_Hold] = []
        failed: set[tuple[int, int, int, tuple[str, ...]]] = set()
        still: list[Wanted] = []
        for w in order:
            if w.not_before > t or self.budget[0] <= 0:
                still.append(w)
                continue
            found = None if (not w.exclude and w.shape in failed) else self._place(w)
            if found is not None:
                pool, picked = found
                self.take(t, w.run_s, pool, w.g, picked)
                out[w.id] = Start(t, pool.name, tuple(s.name for s, k in picked
                                                      for _ in range(k)))
                continue
            if w.starving_at > t and self._borrow(t, w, held, out):
                continue
            if not w.exclude:
                failed.add(w.shape)
            if w.starving_at <= t and len(held) < self.max_holds:
                h = self._hold(t, w)
                if h is not None:
                    held.append(h)
                failed.clear()  # a hold changes what fits; shapes are checked again
            still.append(w)
        for h in held:  # holds last one step: the gang looks again at the next
            for name, k in h.gpus.items():
                node = h.pool.slots[name]
                h.pool.set_free(node, node.free + k)
        return still

    def _borrow(self, t: float, w: Wanted, held: list[_Hold], out: dict[str, Start]) -> bool:
        """Backfill into a hold (policies/backfill.py): a job whose declared limit ends before
        the gang could start there may use the GPUs held for it."""
        for h in held:
            if h.pool.name not in w.pools or t + max(w.run_s, w.declared_s) > h.ready:
                continue
            h.release()
            picked = h.pool.fit(w, self.budget)
            if picked is not None:
                self.take(t, w.run_s, h.pool, w.g, picked)
                out[w.id] = Start(t, h.pool.name, tuple(s.name for s, k in picked
                                                        for _ in range(k)))
            h.retake()
            if picked is not None:
                return True
        return False

    def _place(self, w: Wanted) -> tuple[PoolState, list[tuple[Slot, int]]] | None:
        for name in w.pools:
            pool = self.pools.get(name)
            if pool is None:
                continue
            picked = pool.fit(w, self.budget)
            if picked is not None:
                return pool, picked
        return None

    def _hold(self, t: float, w: Wanted) -> _Hold | None:
        for name in w.pools:
            pool = self.pools.get(name)
            if pool is None:
                continue
            taken, domain = pool.hold(w, self.budget)
            if taken:
                gpus = {s.name: k for s, k in taken}
                return _Hold(pool, gpus, self._ready(t, pool, w, domain, gpus))
        return None

    def _ready(self, t: float, pool: PoolState, w: Wanted, domain: list[Slot],
               gpus: dict[str, int]) -> float:
        """When the gang fits on `domain` by the projected releases (inf: not known)."""
        avail = {s.name: s.free + gpus.get(s.name, 0) for s in domain}
        cap = sum(v // w.g for v in avail.values())
        self.budget[0] -= len(self.events) + 1
        ups = sorted((e[0], e[3], e[4]) for e in self.events
                     if e[2] == pool.name and e[3] in avail)
        for at, node, k in ups:
            if cap >= w.replicas:
                break
            old = avail[node]
            avail[node] = min(pool.slots[node].total, old + k)
            cap += avail[node] // w.g - old // w.g
            t = at
        return t if cap >= w.replicas else math.inf


@dataclass(slots=True)
class _Hold:
    pool: PoolState
    gpus: dict[str, int]
    """GPUs held per node."""
    ready: float

    def release(self) -> None:
        for name, k in self.gpus.items():
            s = self.pool.slots[name]
            self.pool.set_free(s, s.free + k)

    def retake(self) -> None:
        for name, k in self.gpus.items():
            s = self.pool.slots[name]
            self.gpus[name] = min(k, s.free)
            self.pool.set_free(s, s.free - self.gpus[name])
