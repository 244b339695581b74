"""What an admission cycle decides (policies/cycle.py): a decision per pending job and
the compact record of the cycle, with the digest of its inputs."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from broker.domain.attempts import Placement
from broker.domain.inventory import InventorySnapshot
from broker.domain.reasons import Reason
from policies.placement import PoolVerdict
from policies.preemption import Victim
from policies.types import PendingJob, Usage


@dataclass(frozen=True, slots=True)
class Decision:
    job_id: str
    admitted: bool
    reason: Reason
    message: str
    placement: Placement | None = None
    verdicts: tuple[PoolVerdict, ...] = ()
    borrowed_gpus: int = 0
    victims: tuple[Victim, ...] = ()
    reservation: str | None = None
    """'pool:domain' where capacity is held for this starving gang."""
    position: int = -1
    """Place in the cycle's admission order (-1: not ordered, e.g. in backoff)."""
    demoted: str | None = None
    """Why the job was decided as the lowest priority class (a spent `lowest` GPU-hour budget,
    policies.budgets); the admission event says it too."""


@dataclass(frozen=True, slots=True)
class CycleRecord:
    """The compact decision record written per cycle."""

    at: datetime
    inputs_digest: str
    pending: int
    admitted: int
    waiting: int
    reasons: tuple[tuple[str, int], ...]
    admitted_to: tuple[tuple[str, str], ...]
    reservations: tuple[str, ...]
    victims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CycleResult:
    decisions: tuple[Decision, ...]
    """One per pending job, in the cycle's order (jobs in backoff last)."""
    record: CycleRecord

    def admitted(self) -> list[Decision]:
        return [d for d in self.decisions if d.admitted]

    def by_job(self) -> dict[str, Decision]:
        return {d.job_id: d for d in self.decisions}


def inputs_digest(
    pending: Sequence[PendingJob], inventory: InventorySnapshot, usage: Usage, now: datetime
) -> str:
    h = hashlib.sha256()
    h.update(now.isoformat().encode())
    for j in sorted(pending, key=lambda j: j.id):
        queue = "" if j.queue == "default" else f"@{j.queue}"
        h.update(f"{j.id}{queue}:{j.priority}:{j.replicas}x{j.gpus_per_replica};".encode())
    for p in sorted(inventory.pools, key=lambda p: p.name):
        # expected releases steer reservations: each node's count, then its epoch seconds and
        # GPUs, hashed as packed doubles (the cycle digests every running gang's release:
        # text for each was a few per cent of the loop)
        names: list[str] = []
        releases = array("d")
        for n in p.nodes:
            if n.releases:
                names.append(n.name)
                releases.append(len(n.releases))
                for t, g in n.releases:
                    releases.append(t.timestamp())
                    releases.append(g)
        h.update(f"{p.name}:{p.free_gpus}:{p.drained}:{p.queue.pending_gpus};"
                 f"{','.join(names)};".encode())
        h.update(releases.tobytes())
    h.update(",".join(sorted(inventory.unreachable)).encode())
    for k, v in sorted(usage.in_use.items()):
        h.update(f"{k[0]}/{k[1]}={v};".encode())
    for k, v in sorted(usage.queue_gpus.items()):
        h.update(f"{k[0]}@{k[1]}={v};".encode())
    return h.hexdigest()[:16]
