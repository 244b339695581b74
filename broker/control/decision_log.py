"""The decision log, written by the admission cycle and pruned by the control loop.

Each admission cycle stores its record (admission_cycles: inputs digest, counts, victims).
With it, in the same transaction, go the decisions of the jobs it considered (admitted or
not, reason and message, the verdict per pool, the victims chosen, the placement or
reservation), but only those that changed: a job's decision is logged when the cycle admits
it or gives it a new reason or a message with new wording, not only new figures (when its
explanation is saved too: broker.domain.reason_messages), the first time this leader
considers it (so after a restart or a hand-over every waiting job is logged once
again), and when its last logged decision is older than half the retention (so a job that
waits unchanged for weeks keeps one). A cycle that logged nothing for a waiting job repeated
its previous logged decision. What was logged when is soft state on the plane.

Logging only the changes keeps a cycle of 10,000 waiting jobs from writing 10,000 rows each
time; an unchanged job costs a dictionary look-up (building and hashing the payloads of
10,000 decisions took 3.6 s on the loaded 2-core test machine). Pruning deletes whole cycles
older than `control.decision_retention`, in batches of `control.decision_prune_batch` cycles
per transaction.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Set
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session

from broker.control.plane import ControlPlane
from broker.store import decision_log as store
from policies.cycle import Decision

log = logging.getLogger("isthmus.control")

Logged = dict[str, datetime]
"""job -> when its decision was last logged."""

PRUNE_MAX_BATCHES = 20
"""Transactions per pruning pass: a backlog is worked off over several passes."""


def payload(d: Decision) -> dict[str, Any]:
    """What the log keeps of a decision (its queue position and estimate are left out: they
    move every cycle and `isthmus explain` shows the current ones)."""
    return {
        "admitted": d.admitted,
        "reason": d.reason.value,
        "message": d.message,
        "placement": d.placement.model_dump(mode="json") if d.placement else None,
        "borrowed_gpus": d.borrowed_gpus,
        "reservation": d.reservation,
        "pools": [{"pool": v.pool, "fits": v.fits, "reason": v.reason.value,
                   "message": v.message} for v in d.verdicts],
        "victims": [{"job_id": v.job_id, "team": v.team, "pool": v.pool, "gpus": v.gpus,
                     "reason": v.reason.value} for v in d.victims],
    }


def _logged(plane: ControlPlane) -> Logged:
    """What this leader logged last (soft state on the plane, whose own fields belong to
    plane.py)."""
    return plane.soft.decisions_logged


def record(
    session: Session, plane: ControlPlane, cycle_id: int, now: datetime,
    decisions: Iterable[Decision], team_of: Mapping[str, str], changed: Set[str],
) -> Logged:
    """Log the cycle's decisions of the jobs in `changed` (admitted, or a new reason or
    message: those whose explanation the cycle saves), of jobs this leader has not logged,
    and of jobs logged longer than half the retention ago. Pass the result to `remember`
    once the transaction committed. Unchanged jobs cost a dictionary look-up: no payload is
    built for them."""
    logged = _logged(plane)
    refresh = timedelta(seconds=plane.config.control.decision_retention / 2)
    rows: list[store.LoggedDecision] = []
    seen: Logged = {}
    for d in decisions:
        last = logged.get(d.job_id)
        if last is not None and d.job_id not in changed and now - last < refresh:
            seen[d.job_id] = last
            continue
        body = json.dumps(payload(d), sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(body.encode()).hexdigest()[:32]
        rows.append(store.LoggedDecision(d.job_id, team_of.get(d.job_id, ""), d.admitted,
                                         d.reason.value, digest, body))
        seen[d.job_id] = now
    store.insert_decisions(session, cycle_id, rows)
    return seen


def remember(plane: ControlPlane, logged: Logged) -> None:
    """After the cycle's commit: what is logged now (jobs not considered drop out)."""
    state = _logged(plane)
    state.clear()
    state.update(logged)


def prune(plane: ControlPlane) -> int:
    """Delete cycles (and their decisions) older than the retention; the cycles deleted."""
    c = plane.config.control
    before = plane.clock() - timedelta(seconds=c.decision_retention)
    deleted = store.prune(plane.db, before, c.decision_prune_batch, PRUNE_MAX_BATCHES)
    if deleted:
        log.info("decision log: pruned %d admission cycles older than %s", deleted,
                 before.isoformat(timespec="seconds"))
    return deleted
