"""What the queue estimate (policies/eta.py) learns from the store besides the cycle: the
run-time model (policies/run_length.py) from recently ended attempts (team, declared limit,
GPUs, run time), and the running attempts
whose declared and predicted ends it can match to the backends' releases.

Both are read once per admission cycle; what never changes (an attempt's team, declared limit
and placed nodes) is parsed once and kept on the plane (soft state: re-read on loss)."""

from __future__ import annotations

import json
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session

from broker.control.guard import JobGuard
from broker.control.plane import ControlPlane
from broker.control.soft_state import ETA_FACTS_MAX, AttemptKey, EtaFacts, KeptEnds
from broker.domain.attempts import Placement
from broker.store import attempts as att
from broker.store.in_lists import one_of
from broker.store.records import JOBS
from policies.eta import Running, running_at, running_ends
from policies.run_length import RunSample, RuntimeModel

RATIO_SAMPLES = 1000
"""Ended attempts the run-time model learns from (the most recent)."""
MAX_RUNNING = 10_000
"""Running attempts matched to releases, at most (the others keep the factor)."""

_Key = AttemptKey
_Facts = EtaFacts

# Read every cycle: built once (building and keying a statement cost SQLAlchemy more than
# SQLite spends running it)
_A = att.ATTEMPTS
_SPECS = sa.select(JOBS.c.id, JOBS.c.team, JOBS.c.spec_json).where(
    one_of(JOBS.c.id, "ids"))
_ENDED = (sa.select(_A.c.job_id, _A.c.number, _A.c.started_at, _A.c.ended_at)
          .where(_A.c.ended_at.is_not(None), _A.c.started_at.is_not(None),
                 _A.c.failure.is_(None), _A.c.preempted.is_(False))
          .order_by(_A.c.ended_at.desc()).limit(RATIO_SAMPLES))
_RUNNING = (sa.select(_A.c.job_id, _A.c.number, _A.c.started_at)
            .where(_A.c.ended_at.is_(None), _A.c.started_at.is_not(None))
            .order_by(_A.c.started_at.desc()).limit(MAX_RUNNING))


def _cache(plane: ControlPlane) -> dict[_Key, _Facts]:
    """SoftState.eta_facts, emptied when it has grown past its bound."""
    if len(plane.soft.eta_facts) > ETA_FACTS_MAX:
        plane.soft.eta_facts = {}
    return plane.soft.eta_facts


def _facts(plane: ControlPlane, s: Session, keys: list[_Key],
           nodes: bool) -> dict[_Key, _Facts]:
    """(team, declared limit in seconds, placed nodes, GPUs) of attempts `keys`, cached."""
    cache = _cache(plane)
    missing = [k for k in keys if k not in cache or (nodes and cache[k][2] is None)]
    if missing:
        ids = sorted({k[0] for k in missing})
        jobs = {r[0]: (r[1], r[2]) for r in s.connection().execute(_SPECS, {"ids": ids})}
        snaps = att.snapshots(s, missing) if nodes else {}
        for k in missing:
            if k[0] not in jobs:
                continue
            with JobGuard("run-time sample", k[0]):
                team, spec = jobs[k[0]]
                placed = _nodes(snaps[k]) if k in snaps else None
                parsed = plane.spec(k[0], spec, keep=False)  # kept here, as facts
                cache[k] = (team, float(parsed.max_runtime), placed, parsed.gang.total_gpus)
    return {k: cache[k] for k in keys if k in cache}


def _nodes(snapshot_json: str) -> tuple[str, ...]:
    placement = json.loads(snapshot_json).get("placement")
    return () if placement is None else Placement.model_validate(placement).nodes


def runtime_model(plane: ControlPlane, s: Session, *, prune: bool = False) -> RuntimeModel:
    """Learnt from the attempts that recently ended without a failure or preemption: declared
    limits are over-estimates (users round up), so the estimate predicts what they turn out to
    be here (bench/eta_accuracy.py measures it). `prune` (the real cycle only, whose last
    pass's running attempts are known): keep the facts of these ended attempts and of those
    running at the last pass, and drop the others (never read again)."""
    rows = s.connection().execute(_ENDED).all()
    facts = _facts(plane, s, [(r.job_id, r.number) for r in rows], nodes=False)
    if prune:
        running = plane.soft.running_ends
        # a copy first: a what-if in another thread may add facts meanwhile
        plane.soft.eta_facts = {k: v for k, v in list(plane.soft.eta_facts.items())
                                if k in facts or k in running}
    return RuntimeModel.learn(
        RunSample(facts[(r.job_id, r.number)][0], facts[(r.job_id, r.number)][1],
                  (r.ended_at - r.started_at).total_seconds(), facts[(r.job_id, r.number)][3])
        for r in rows if (r.job_id, r.number) in facts
    )


def running_work(plane: ControlPlane, s: Session, model: RuntimeModel,
                 now: datetime, *, keep: bool = True) -> list[Running]:
    """The running attempts on their placed nodes: declared end (start + limit, as the
    backends announce the release) and predicted ends (the model, given the time run: the
    point and the window's; policies.eta.running). Only the real cycle (`keep`) replaces the
    ends kept for the next one: a what-if reads them, and leaves them as they were."""
    rows = s.connection().execute(_RUNNING).all()
    facts = _facts(plane, s, [(r.job_id, r.number) for r in rows], nodes=True)
    known = plane.soft.running_ends
    kept: dict[_Key, KeptEnds] = {}
    out: list[Running] = []
    for r in rows:
        key = (r.job_id, r.number)
        f = facts.get(key)
        if f is None:
            continue
        team, limit, nodes, gpus = f
        held = known.get(key)
        # an attempt's ends stay while the same model's same samples ran longer than it has:
        # predicted again only then, not every cycle
        if held is None or held[0] is not model or held[1] != r.started_at \
                or not held[2].ratios.covers(limit, (now - r.started_at).total_seconds()):
            ends = running_ends(r.started_at, limit, team, gpus, model, now)
            held = (model, r.started_at, ends, ())
        ends = held[2]
        if held[3] and not ends.clamped(now):
            runs = held[3]  # the same work on the same nodes as last cycle
        else:
            runs = tuple(running_at(node, ends, now) for node in sorted(set(nodes or ())))
            if not ends.clamped(now):
                held = (model, r.started_at, ends, runs)
        kept[key] = held
        out.extend(runs)
    if keep:
        plane.soft.running_ends = kept
    return out
