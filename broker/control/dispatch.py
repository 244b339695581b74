"""The dispatcher: turns committed intents (attempt rows with dispatch='pending') into backend
objects. Before creating anything it looks the deterministic name up, so an intent resumed
after a crash adopts what the previous run created instead of making a duplicate.

One intent never holds up the others: each is dispatched inside a per-job guard, the intents
of a pass are taken in turn across backends (oldest first within each), and once a backend is
found unreachable its remaining intents of the pass wait with BackendUnavailable without
asking it again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

import yaml
from sqlmodel import Session

from backends.base import (
    BackendUnavailable,
    Rendering,
    SubmitRequest,
    SubmitResult,
    Unsupported,
    masked,
)
from broker.control.faults import crash_point
from broker.control.guard import SYSTEMIC, Incident, JobGuard
from broker.control.plane import ControlPlane, log
from broker.control.requeue import DISPATCHER, requeue_refused
from broker.domain import JobState, Reason
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.store import attempts as att
from broker.store import batch, cause_lookups
from broker.store.queries import get_job, jobs_by_ids
from broker.store.records import JobRecord, lock_jobs
from broker.store.secrets import digest, progress_token, server_secret


def _request(plane: ControlPlane, a: att.AttemptRecord, token: str,
             owner: str | None = None, number: int | None = None) -> SubmitRequest:
    snapshot = plane.snapshot(a, keep=True)  # for the reconciler's first sight of the run
    assert snapshot.placement is not None
    env = {
        "ISTHMUS_JOB_ID": a.job_id,
        "ISTHMUS_ATTEMPT": str(a.number),
        "ISTHMUS_PROGRESS_TOKEN": token,
    }
    if snapshot.resume_from:
        env["ISTHMUS_RESUME_FROM"] = snapshot.resume_from
    if a.number > 1:  # as Slurm sets it in a requeued job: the times the job went again
        env["SLURM_RESTART_COUNT"] = str(a.number - 1)
    return SubmitRequest(
        job_id=a.job_id, attempt=a.number, name=a.backend_name, snapshot=snapshot,
        placement=snapshot.placement, env=env, owner=owner, job_number=number,
    )


def rendered(backend: object, request: SubmitRequest) -> str | None:
    """The exact script or manifests (`Backend.render`; None from the simulator, and from a
    stand-in without `render`), the secret progress token masked: it is in the object, but it
    is nobody's business to read it here. For an adopted object; a submit returns its own."""
    render = getattr(backend, "render", None)
    if render is None:
        return None
    try:
        return as_text(render(masked(request)))
    except Exception as exc:  # rendering is for people; never fail a dispatch over it
        return f"# could not render: {exc}"


# libyaml's emitter when PyYAML was built with it (its wheels are): the same text as the
# pure-Python SafeDumper at about a sixth of the CPU, paid by the control loop on every dispatch
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def as_text(rendering: Rendering) -> str | None:
    """The manifests of a rendering as the YAML a person reads (a script stays as it is)."""
    if rendering is None or isinstance(rendering, str):
        return rendering
    return yaml.dump_all(rendering, Dumper=_DUMPER, sort_keys=False)


CREATED, SKIPPED, UNAVAILABLE = "created", "skipped", "unavailable"


def dispatch_one(plane: ControlPlane, a: att.AttemptRecord, key: bytes) -> bool:
    """True when the backend object exists (created or adopted) and the job is PREPARING."""
    with plane.db.read() as s:
        job = get_job(s, a.job_id)
    _, made = _dispatch(plane, a, key, job)
    return isinstance(made, Made) and _flush(plane, [made]) == 1


@dataclass(frozen=True)
class Made:
    """A backend object created (or adopted) for an intent, to be recorded."""

    attempt: att.AttemptRecord
    result: SubmitResult
    token: str
    shown: str | None
    at: datetime


def _dispatch(plane: ControlPlane, a: att.AttemptRecord, key: bytes,
              job: JobRecord | None) -> tuple[str, Made | str | None]:
    """(outcome, what to record): CREATED with the object made, UNAVAILABLE with what the
    unreachable backend answered, SKIPPED with nothing. `job` as read for the pass."""
    if job is None or job.state != JobState.ADMITTED or job.attempt != a.number:
        with plane.db.write() as s:  # cancelled or requeued before its object was made
            att.update(s, a.job_id, a.number, dispatch=att.ABANDONED, ended_at=plane.clock())
        return SKIPPED, None
    backend = plane.backends.get(a.backend)
    if backend is None:
        requeue_refused(plane, a, f"backend '{a.backend}' is not configured any more")
        return SKIPPED, None
    token = progress_token(key, a.job_id, a.number)
    request = _request(plane, a, token, owner=job.submitted_by, number=job.number)
    try:
        found = backend.lookup(a.backend_name)
        if found is not None:  # adopted: rendered for the record (what it would have been)
            result = SubmitResult(a.backend_name, found.backend_id or "", adopted=True)
            shown = rendered(backend, request)
        else:
            result = backend.submit(request)  # renders once: what it sent comes back
            crash_point("after-backend-create")
            shown = as_text(result.rendered)
    except BackendUnavailable as exc:
        why = f"{a.backend}: {exc}"
        _unavailable(plane, a, why)
        return UNAVAILABLE, why
    except Unsupported as exc:  # Slurm's SubmitRefused too
        requeue_refused(plane, a, f"{a.backend} refused the job: {exc}")
        return SKIPPED, None
    return CREATED, Made(a, result, token, shown, plane.clock())


def _record(plane: ControlPlane, made: list[Made]) -> tuple[list[tuple[Made, Incident]], int]:
    """The objects made, recorded in one transaction (attempt CREATED, job PREPARING). If it
    fails, each is recorded again in a transaction of its own under its job's guard: one that
    fails then is returned with its incident, the others are recorded (no savepoint per job
    in the common case: one each cost a quarter of the pass). Returns the failed ones and the
    number recorded."""
    try:
        return [], _record_in(plane, made)
    except SYSTEMIC:
        raise
    except Exception as exc:  # a job's failure: find it by recording them one by one
        log.warning("dispatch: %d objects not recorded together (%s); one by one instead",
                    len(made), type(exc).__name__)
    failed: list[tuple[Made, Incident]] = []
    recorded = 0
    for m in made:
        with JobGuard("dispatch record", m.attempt.job_id) as guard:
            recorded += _record_in(plane, [m])
        if guard.incident is not None:
            failed.append((m, guard.incident))
    return failed, recorded


def _record_in(plane: ControlPlane, made: list[Made]) -> int:
    """One transaction: the jobs locked and checked first (one that moved on since the pass
    read it is skipped: `_moved_on`), then each attempt CREATED and its job PREPARING. The
    number recorded.

    Whether the transitions' causes were applied before is asked in one statement once the
    jobs are locked (broker.store.cause_lookups), and the attempts' rows, the events and the
    job states are queued and sent as one executemany per statement (broker.store.batch):
    each made object is another job's, and nothing in the transaction reads back what another
    one queued. Their metrics are counted once the transaction committed."""
    moved: set[int] = set()
    causes = [(m.attempt.job_id, _cause_key(m.attempt)) for m in made]
    with plane.db.write() as s:
        jobs = lock_jobs(s, [m.attempt.job_id for m in made])
        with cause_lookups.read_ahead(s, causes), batch.deferred(s, effects=False) as effects:
            for m in made:
                a = m.attempt
                if _moved_on(s, jobs.get(a.job_id), a, m.at):
                    moved.add(id(m))
                    continue
                att.update_queued(
                    s, a.job_id, a.number, dispatch=att.CREATED,
                    backend_id=m.result.backend_id, dispatched_at=m.at,
                    progress_token_sha256=digest(m.token), rendered=m.shown,
                )
                verb = "adopted" if m.result.adopted else "created"
                set_state(
                    s, a.job_id, JobState.PREPARING, Reason.BackendPending,
                    Cause("dispatcher", DISPATCHER, key=_cause_key(a)),
                    f"{verb} {a.backend_name} on {a.backend} ({m.result.backend_id})",
                    now=m.at, locked=jobs[a.job_id],
                )
    effects.run_effects()
    for m in made:
        if id(m) not in moved:
            log.info("dispatch %s: %s on %s", m.attempt.backend_name,
                     "adopted" if m.result.adopted else "created", m.attempt.backend)
    return len(made) - len(moved)


def _cause_key(a: att.AttemptRecord) -> str:
    return f"dispatched:{a.number}"


def _moved_on(s: Session, job: JobRecord | None, a: att.AttemptRecord, now: datetime) -> bool:
    """Whether the job left this attempt since the pass read it (cancelled, or preempted back
    to the queue and maybe admitted again): its object is then not recorded, its attempt is
    left ended, and the reconciler cancels the object as an orphan."""
    if job is not None and job.state == JobState.ADMITTED and job.attempt == a.number:
        return False
    current = att.get_attempt(s, a.job_id, a.number)
    ended = current.ended_at if current is not None and current.ended_at else now
    att.update(s, a.job_id, a.number, dispatch=att.ABANDONED, ended_at=ended)
    log.info("dispatch %s: its job moved on while the object was made; left to the "
             "reconciler as an orphan", a.backend_name)
    return True


def _unavailable(plane: ControlPlane, a: att.AttemptRecord, why: str) -> None:
    with plane.db.write() as s:
        set_state(s, a.job_id, JobState.ADMITTED, Reason.BackendUnavailable,
                  Cause("dispatcher", DISPATCHER), why)


def _failed(plane: ControlPlane, a: att.AttemptRecord, incident: Incident) -> None:
    """An unexpected error: requeued away from that pool (see `requeue_refused`). If the object was
    created before the error, the reconciler cancels it as an orphan (its attempt is ended)."""
    with JobGuard("requeue after a failed dispatch", a.job_id):
        requeue_refused(plane, a, incident.message, Reason.InternalError)


def in_turns(intents: list[att.AttemptRecord]) -> list[att.AttemptRecord]:
    """Oldest first within each backend, the backends taking turns: a backend with many
    intents (or a slow one) does not make the others' intents wait for all of its own."""
    queues: dict[str, list[att.AttemptRecord]] = {}
    for a in intents:
        queues.setdefault(a.backend, []).append(a)
    out: list[att.AttemptRecord] = []
    for i in range(max((len(q) for q in queues.values()), default=0)):
        out.extend(q[i] for q in queues.values() if i < len(q))
    return out


RECORD_EVERY = 50
RECORD_AFTER_S = 0.5
"""The objects a pass made are recorded in one transaction per RECORD_EVERY of them, or once
the oldest unrecorded one is RECORD_AFTER_S old (until recorded, a job shows ADMITTED while
its object exists: the reconciler leaves an object whose attempt is live alone, and the next
pass adopts it by name if the process dies first). One transaction per intent cost the soak's
leader three round trips, a commit and a lease check per job."""


def run_dispatch(plane: ControlPlane) -> int:
    with plane.db.read() as s:
        intents = att.to_dispatch(s)
        jobs = jobs_by_ids(s, [a.job_id for a in intents]) if intents else {}
    if not intents:
        return 0
    key = plane.soft.progress_key
    if key is None:
        key = plane.soft.progress_key = server_secret(plane.db, "progress")
    down: dict[str, str] = {}  # backends found unreachable in this pass, and why
    made: list[Made] = []
    created = 0
    since = time.monotonic()
    for a in in_turns(intents):
        with JobGuard("dispatch", a.job_id) as guard:
            if a.backend in down:
                _unavailable(plane, a, down[a.backend])
                continue
            outcome, what = _dispatch(plane, a, key, jobs.get(a.job_id))
            if isinstance(what, Made):
                if not made:
                    since = time.monotonic()
                made.append(what)
            elif outcome == UNAVAILABLE and isinstance(what, str):
                down[a.backend] = what
        if guard.incident is not None:
            _failed(plane, a, guard.incident)
        if len(made) >= RECORD_EVERY or (made and time.monotonic() - since >= RECORD_AFTER_S):
            created += _flush(plane, made)
            made = []
    return created + _flush(plane, made)


def _flush(plane: ControlPlane, made: list[Made]) -> int:
    """Record `made`; one whose record failed is requeued as a failed dispatch is (`_failed`:
    away from that pool; the reconciler cancels its object as an orphan). The number recorded."""
    if not made:
        return 0
    failed, recorded = _record(plane, made)
    for m, incident in failed:
        _failed(plane, m.attempt, incident)
    return recorded
