"""Per-job isolation for the control loop: one job's unexpected exception never stops the
others.

Every per-job step of a cycle (building a job's admission or preemption view, persisting its
decision, dispatching its intent, applying its facts, applying its retry) runs inside
`JobGuard`. An exception escaping the step is logged with the job id and a short correlation
id, kept as an `Incident`, and the cycle goes on with the next job; the caller then decides
what the job's state becomes (`mark` puts `InternalError` on it where a reason may change).

Not swallowed: errors of the database connection itself (no job is to blame and every other
job would fail the same way, so the pass ends and the scheduler runs it again), and
BaseExceptions (KeyboardInterrupt, SystemExit).

The correlation id is derived from the step, the job and the error, so a failure that repeats
every cycle keeps one id: its log lines group together and the job's message (hence its
event history) does not change every cycle.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType

import sqlalchemy.exc
from sqlmodel import Session

from broker.domain import JobState, Reason
from broker.domain.states import REASON_UPDATES
from broker.logs import get_logger
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.store.fence import Deposed
from broker.store.queries import get_job

log = get_logger(__name__)

SYSTEMIC: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError,  # connection lost, database locked: nobody's fault
    sqlalchemy.exc.InterfaceError,
    Deposed,  # a fenced write of a deposed leader: the whole pass stops, the runtime steps down
)

# Correlation ids already logged with their traceback. Soft state: losing it (a restart) only
# logs one more traceback; bounded so that a long life cannot make it grow without end.
_LOGGED: set[str] = set()
_LOGGED_MAX = 4096


@dataclass(frozen=True, slots=True)
class Incident:
    step: str  # what was being done, e.g. "dispatch"
    job_id: str
    error: Exception
    correlation: str  # short id, in the log and in the job's message

    @property
    def message(self) -> str:
        return (f"internal error during {self.step} ({type(self.error).__name__}); "
                f"correlation id {self.correlation} in the broker log")


def correlation_id(step: str, job_id: str, error: BaseException) -> str:
    text = f"{step}\0{job_id}\0{type(error).__qualname__}\0{error}"
    return hashlib.blake2s(text.encode(errors="replace"), digest_size=5).hexdigest()


class JobGuard:
    """`with JobGuard("dispatch", job_id) as g: ...`; afterwards `g.incident` is None, or
    what went wrong (the exception did not propagate). `subject` names what `job_id` is in
    the log ("backend" for a step that concerns a whole backend)."""

    def __init__(self, step: str, job_id: str, subject: str = "job") -> None:
        self.step, self.job_id, self.subject = step, job_id, subject
        self.incident: Incident | None = None

    def __enter__(self) -> JobGuard:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if not isinstance(error, Exception) or isinstance(error, SYSTEMIC):
            return False
        cid = correlation_id(self.step, self.job_id, error)
        self.incident = Incident(self.step, self.job_id, error, cid)
        if cid in _LOGGED:
            log.error("%s of %s %s failed again [%s]: %s: %s", self.step, self.subject,
                      self.job_id, cid, type(error).__name__, error)
        else:
            if len(_LOGGED) >= _LOGGED_MAX:
                _LOGGED.clear()
            _LOGGED.add(cid)
            log.error("%s of %s %s failed [%s]: %s: %s", self.step, self.subject, self.job_id,
                      cid, type(error).__name__, error, exc_info=error)
        return True


def mark(s: Session, incident: Incident, actor: str, now: datetime) -> bool:
    """Show the incident on its job (`InternalError`) where the job's state lets its reason
    change; an ended job keeps its reason (the log has the incident). True when marked."""
    job = get_job(s, incident.job_id)
    if job is None or JobState(job.state) not in REASON_UPDATES:
        return False
    with s.begin_nested():
        return set_state(s, job.id, JobState(job.state), Reason.InternalError,
                         Cause("guard", actor), incident.message, now=now).accepted
