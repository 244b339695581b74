"""Why a job waits (or where it goes), for humans (`to_text`) and machines (`model_dump`).

The pool list is stable: fitting pools by score, then refused pools from the most severe
reason down, ties by pool name; the same inputs always give the same text.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from broker.domain.attempts import Placement
from broker.domain.inventory import InventorySnapshot
from broker.domain.reasons import Reason, most_severe, severity
from broker.domain.spec import BackendKind
from broker.domain.start_window import likely
from broker.domain.topology import TopologyLevel
from policies.cycle import AdmissionParams, Decision, admission_cycle
from policies.eta import Estimate, Window
from policies.placement import PoolVerdict, verdict_order
from policies.types import PendingJob, QuotaConfig, Usage


class PoolLine(BaseModel):
    """A pool's verdict as an explanation stores and serves it: the wire and stored form of
    `policies.placement.PoolVerdict` (a slots dataclass the cycle makes per job and pool, where
    pydantic's validation would cost), with its reason's `severity` added and the projection's
    internals (`expected_wait_s`) left out. Its fields are the verdict's (`_line` copies them by
    name, and tests/unit/policies/test_explain.py keeps the two in step)."""

    model_config = ConfigDict(frozen=True)

    pool: str
    flavor: str
    backend: str
    backend_kind: BackendKind
    fits: bool
    reason: Reason
    severity: int
    message: str
    score: float | None = None
    level: TopologyLevel | None = None
    domain: str | None = None
    queued: bool = False


class StartWindow(BaseModel):
    """Where the start is likely to fall (policies.eta.Window): inside [earliest, latest] for
    the stated share (`coverage`, 0..1) of jobs."""

    model_config = ConfigDict(frozen=True)

    earliest: datetime
    latest: datetime
    coverage: float


class Explanation(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: str
    admitted: bool
    reason: Reason
    """The reason the job's state carries after this decision."""
    most_severe: Reason
    """The most severe reason over the decision and every pool verdict."""
    message: str
    placement: Placement | None = None
    pools: tuple[PoolLine, ...] = ()
    victims: tuple[str, ...] = ()
    reservation: str | None = None
    position: int | None = None
    """1-based place among waiting jobs in admission order (0: in backoff, not ordered)."""
    team_position: int | None = None
    estimated_start: datetime | None = None
    estimate_method: str | None = None
    """How `estimated_start` was found (policies.eta): now, releases, preemption, unknown: why."""
    start_window: StartWindow | None = None
    """Where the start is likely to fall, around `estimated_start` (None: no window)."""

    def to_text(self) -> str:
        state = "admitted" if self.admitted else "waiting"
        lines = [
            f"job {self.job_id}: {state} - {self.reason.value} "
            f"(most severe: {self.most_severe.value}, severity {severity(self.most_severe)})",
            f"  {self.message}",
        ]
        if self.placement is not None:
            p = self.placement
            where = f" {p.topology_level.value} {p.topology_domain}" if p.topology_level else ""
            lines.append(
                f"  placement: {p.pool} on {p.backend.value}/{p.backend_instance}, "
                f"flavor {p.flavor}{where}, {len(p.nodes)} replica(s)"
            )
        if self.victims:
            lines.append(f"  preempting: {', '.join(self.victims)}")
        if self.reservation:
            lines.append(f"  reservation: {self.reservation}")
        if self.estimate_method is not None:
            lines.append(f"  {wait_text(self)}")
        width = max((len(x.pool) for x in self.pools), default=4)
        for x in self.pools:
            mark = "ok " if x.fits else "-- "
            score = f" score {x.score:.3f}" if x.score is not None else ""
            lines.append(
                f"  {mark}{x.pool:<{width}}  {x.flavor:<10} {x.backend_kind.value:<5} "
                f"{x.reason.value}{score}: {x.message}"
            )
        return "\n".join(lines)


_LINE_FIELDS = tuple(name for name in PoolLine.model_fields if name != "severity")


def _line(v: PoolVerdict) -> PoolLine:
    return PoolLine(severity=severity(v.reason), **{f: getattr(v, f) for f in _LINE_FIELDS})


def wait_text(x: Explanation) -> str:
    """Queue position and estimated start in one line."""
    parts = []
    if x.position:
        parts.append(f"position {x.position} in the queue ({x.team_position} in its team)")
    if x.estimated_start is not None:
        at = x.estimated_start.strftime("%Y-%m-%d %H:%M:%SZ")
        w = x.start_window
        if w is not None:
            parts.append(f"start {likely(w.earliest, w.latest, w.coverage)}, "
                         f"estimated {at} ({x.estimate_method})")
        else:
            parts.append(f"estimated start {at} ({x.estimate_method})")
    else:
        parts.append(f"estimated start {x.estimate_method or 'unknown'}")
    return ", ".join(parts)


def explain(decision: Decision, estimate: Estimate | None = None) -> Explanation:
    """The explanation of one cycle decision, with its queue position and estimated start
    when `estimate` (policies.eta) is given."""
    verdicts = sorted(decision.verdicts, key=verdict_order)
    refused = [v.reason for v in verdicts if not v.fits]
    worst = most_severe([decision.reason, *refused]) or decision.reason
    return Explanation(
        job_id=decision.job_id,
        admitted=decision.admitted,
        reason=decision.reason,
        most_severe=worst,
        message=decision.message,
        placement=decision.placement,
        pools=tuple(_line(v) for v in verdicts),
        victims=tuple(v.job_id for v in decision.victims),
        reservation=decision.reservation,
        position=estimate.position if estimate else None,
        team_position=estimate.team_position if estimate else None,
        estimated_start=estimate.at if estimate else None,
        estimate_method=estimate.method if estimate else None,
        start_window=_window(estimate.window) if estimate else None,
    )


def _window(w: Window | None) -> StartWindow | None:
    return None if w is None else StartWindow(earliest=w.earliest, latest=w.latest,
                                              coverage=w.coverage)


def explain_job(
    job: PendingJob,
    inventory: InventorySnapshot,
    quotas: QuotaConfig,
    usage: Usage,
    now: datetime,
    params: AdmissionParams | None = None,
) -> Explanation:
    """What admission would decide for `job` alone on this snapshot (no other job ahead)."""
    result = admission_cycle([job], inventory, quotas, usage, now, params)
    return explain(result.decisions[0])
