"""A job's timeline: per attempt, the phases from queueing to its end, with durations.

Built from what is stored, never from memory: the event log (state changes carry their attempt
number; ADMITTED opens an attempt), the attempt rows (dispatched_at: the backend object exists;
ended_at) and the stored backend facts (the first observation past PENDING: ranks scheduled).
The first useful step is known per job (first_useful_work_at), so it is shown on the attempt
whose run it falls in; another attempt that reported progress says so without a time.

Phases of one attempt (each from its start to the next one's):
  queued      entered QUEUED (submission, retry, refused dispatch) -> ADMITTED
  dispatch    ADMITTED -> the backend object is created
  scheduling  created -> the backend reports ranks scheduled (a fact past PENDING)
  init        ranks scheduled -> every rank runs (image pull, rendezvous: RUNNING)
  warm-up     RUNNING -> first useful step (progress report)
  running     first useful step (or RUNNING) -> the attempt ends
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from broker.domain import JobState
from broker.domain.units import approx_duration
from broker.store.attempts import AttemptRecord
from broker.store.records import EventRecord

PHASES = ("queued", "dispatch", "scheduling", "init", "warm-up", "running")
_ENDS = {JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value,
         JobState.REJECTED.value, JobState.RETRYING.value}


@dataclass(frozen=True, slots=True)
class FactMark:
    attempt: int
    phase: str
    observed_at: datetime


@dataclass
class Phase:
    name: str
    start: datetime
    end: datetime | None
    """None: still in this phase."""
    note: str = ""

    def seconds(self, now: datetime) -> float:
        return max(0.0, ((self.end or now) - self.start).total_seconds())


@dataclass
class AttemptTimeline:
    number: int
    pool: str | None = None
    phases: list[Phase] = field(default_factory=list)
    outcome: str | None = None
    """The state and reason it ended with (None: not ended)."""
    ended_at: datetime | None = None


def build(
    events: Sequence[EventRecord],
    attempts: Sequence[AttemptRecord],
    facts: Sequence[FactMark],
    first_useful_work_at: datetime | None,
) -> list[AttemptTimeline]:
    """Attempts in order; a job still queued for its next attempt gets an attempt entry
    numbered one past the last with only its queued phase."""
    rows = {a.number: a for a in attempts}
    marks: dict[int, dict[str, datetime]] = {}
    for f in sorted(facts, key=lambda f: f.observed_at):
        m = marks.setdefault(f.attempt, {})
        m.setdefault(f.phase, f.observed_at)
    walk = _walk_events(events)
    out = [
        _attempt(number, walk.points.get(number, {}), rows.get(number),
                 walk.outcome.get(number), marks.get(number, {}), first_useful_work_at)
        for number in sorted(set(walk.points) | set(rows))
    ]
    if walk.queued_since is not None:  # waiting for its next attempt
        nxt_number = (max(walk.points) if walk.points else 0) + 1
        out.append(AttemptTimeline(nxt_number, None, [Phase("queued", walk.queued_since, None)]))
    return out


@dataclass
class _Walk:
    points: dict[int, dict[str, datetime]] = field(default_factory=dict)
    """Per attempt: when it was queued, admitted, running."""
    outcome: dict[int, tuple[str, datetime]] = field(default_factory=dict)
    queued_since: datetime | None = None
    """Set while the job waits for its next attempt."""


def _walk_events(events: Sequence[EventRecord]) -> _Walk:
    """The job's events in order, turned into each attempt's moments and outcome."""
    w = _Walk()
    current = 0
    for e in events:
        if e.to_state == JobState.QUEUED.value and e.from_state != JobState.QUEUED.value:
            w.queued_since = e.at
            if current and current not in w.outcome and e.from_state == JobState.ADMITTED.value:
                w.outcome[current] = (f"QUEUED ({e.reason})", e.at)  # dispatch refused
        elif e.to_state == JobState.ADMITTED.value and e.from_state != JobState.ADMITTED.value:
            current = e.attempt
            p = w.points.setdefault(current, {})
            p["admitted"] = e.at
            if w.queued_since is not None:
                p["queued"] = w.queued_since
            w.queued_since = None
        elif current and e.to_state == JobState.RUNNING.value:
            w.points.setdefault(current, {}).setdefault("running", e.at)
        elif current and e.to_state in _ENDS and current not in w.outcome:
            w.outcome[current] = (f"{e.to_state} ({e.reason})", e.at)
    return w


def _attempt(number: int, p: dict[str, datetime], row: AttemptRecord | None,
             ended: tuple[str, datetime] | None, m: dict[str, datetime],
             first_useful_work_at: datetime | None) -> AttemptTimeline:
    """One attempt's phases, from its moments (`p`), its row, its outcome and the first time
    the backend reported each phase (`m`)."""
    t = AttemptTimeline(number, row.pool if row else None)
    end_at = row.ended_at if row and row.ended_at else (ended[1] if ended else None)
    t.outcome, t.ended_at = (ended[0] if ended else None), end_at
    created = row.dispatched_at if row else None
    scheduled = min(
        (at for ph, at in m.items() if ph not in ("PENDING", "UNKNOWN")), default=None
    )
    running = p.get("running")
    useful = (first_useful_work_at if first_useful_work_at and running
              and first_useful_work_at >= running
              and (end_at is None or first_useful_work_at <= end_at) else None)
    marks_in_order = [
        ("queued", p.get("queued")), ("dispatch", p.get("admitted")),
        ("scheduling", created), ("init", scheduled if created else None),
        ("warm-up", running), ("running", useful),
    ]
    known = [(name, at) for name, at in marks_in_order if at is not None]
    for i, (name, at) in enumerate(known):
        nxt = known[i + 1][1] if i + 1 < len(known) else end_at
        t.phases.append(Phase(name, at, nxt))
    if running and useful is None and t.phases and t.phases[-1].name == "warm-up":
        ph = t.phases[-1]
        if row is not None and row.last_step is not None:
            ph.name, ph.note = "running", "progress reported; its first step's time is " \
                                          "kept only for the job's first useful work"
        else:
            ph.note = "no progress reported"
    return t


def bar_chart(timelines: Sequence[AttemptTimeline], now: datetime, width: int = 40) -> str:
    """A small terminal chart: one row per phase, bars scaled to the job's whole span."""
    starts = [ph.start for t in timelines for ph in t.phases]
    if not starts:
        return "  (no phases yet)"
    t0 = min(starts)
    t1 = max([now if ph.end is None else ph.end for t in timelines for ph in t.phases])
    span = max(1.0, (t1 - t0).total_seconds())
    lines = []
    for t in timelines:
        head = f"attempt {t.number}" + (f" on {t.pool}" if t.pool else "")
        lines.append(head + (f": {t.outcome}" if t.outcome else ""))
        for ph in t.phases:
            a = int((ph.start - t0).total_seconds() / span * width)
            n = max(1, round(ph.seconds(now) / span * width))
            bar = " " * a + "#" * min(n, width - a if width > a else 1)
            still = " (now)" if ph.end is None else ""
            note = f"  {ph.note}" if ph.note else ""
            took = approx_duration(ph.seconds(now))
            lines.append(f"  {ph.name:<10} {bar:<{width}} {took}{still}{note}")
    return "\n".join(lines)

