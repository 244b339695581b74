"""The dispatcher: turns committed intents (attempt rows with dispatch='pending') into backend
objects. Before creating anything it looks the deterministic name up, so an intent resumed
after a crash adopts what the previous run created instead of making a duplicate.

One intent never holds up the others: each is dispatched inside a per-job guard, the intents
of a pass are taken in turn across backends (oldest first within each), and once a backend is
found unreachable its remaining intents of the pass wait with BackendUnavailable without
asking it again.
"""

from __future__ import annotations

import yaml

from backends.base import (
    BackendUnavailable,
    Rendering,
    SubmitRequest,
    SubmitResult,
    Unsupported,
    masked,
)
from broker.control.faults import crash_point
from broker.control.guard import Incident, JobGuard
from broker.control.plane import ControlPlane, log
from broker.control.requeue import DISPATCHER, requeue_refused
from broker.domain import JobState, Reason
from broker.domain.attempts import RunSnapshot
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.store import attempts as att
from broker.store.queries import get_job
from broker.store.secrets import digest, progress_token, server_secret


def _request(plane: ControlPlane, a: att.AttemptRecord, token: str,
             owner: str | None = None) -> SubmitRequest:
    snapshot = RunSnapshot.model_validate_json(a.snapshot_json)
    assert snapshot.placement is not None
    env = {
        "ISTHMUS_JOB_ID": a.job_id,
        "ISTHMUS_ATTEMPT": str(a.number),
        "ISTHMUS_PROGRESS_TOKEN": token,
    }
    if snapshot.resume_from:
        env["ISTHMUS_RESUME_FROM"] = snapshot.resume_from
    return SubmitRequest(
        job_id=a.job_id, attempt=a.number, name=a.backend_name, snapshot=snapshot,
        placement=snapshot.placement, env=env, owner=owner,
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


def as_text(rendering: Rendering) -> str | None:
    if rendering is None or isinstance(rendering, str):
        return rendering
    return yaml.safe_dump_all(rendering, sort_keys=False)


CREATED, SKIPPED, UNAVAILABLE = "created", "skipped", "unavailable"


def dispatch_one(plane: ControlPlane, a: att.AttemptRecord, key: bytes) -> bool:
    """True when the backend object exists (created or adopted) and the job is PREPARING."""
    return _dispatch(plane, a, key)[0] == CREATED


def _dispatch(plane: ControlPlane, a: att.AttemptRecord, key: bytes) -> tuple[str, str]:
    """(outcome, why) for one intent; `why` says what an unreachable backend answered."""
    with plane.db.read() as s:
        job = get_job(s, a.job_id)
    if job is None or job.state != JobState.ADMITTED or job.attempt != a.number:
        with plane.db.write() as s:  # cancelled or requeued before its object was made
            att.update(s, a.job_id, a.number, dispatch=att.ABANDONED, ended_at=plane.clock())
        return SKIPPED, ""
    backend = plane.backends.get(a.backend)
    if backend is None:
        requeue_refused(plane, a, f"backend '{a.backend}' is not configured any more")
        return SKIPPED, ""
    token = progress_token(key, a.job_id, a.number)
    request = _request(plane, a, token, owner=job.submitted_by)
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
        return SKIPPED, ""
    now = plane.clock()
    with plane.db.write() as s:
        att.update(
            s, a.job_id, a.number, dispatch=att.CREATED, backend_id=result.backend_id,
            dispatched_at=now, progress_token_sha256=digest(token),
            rendered=shown,
        )
        verb = "adopted" if result.adopted else "created"
        set_state(
            s, a.job_id, JobState.PREPARING, Reason.BackendPending,
            Cause("dispatcher", DISPATCHER, key=f"dispatched:{a.number}"),
            f"{verb} {a.backend_name} on {a.backend} ({result.backend_id})", now=now,
        )
    log.info("dispatch %s: %s on %s", a.backend_name, verb, a.backend)
    return CREATED, ""


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


def run_dispatch(plane: ControlPlane) -> int:
    with plane.db.read() as s:
        intents = att.to_dispatch(s)
    if not intents:
        return 0
    key = server_secret(plane.db, "progress")
    created = 0
    down: dict[str, str] = {}  # backends found unreachable in this pass, and why
    for a in in_turns(intents):
        with JobGuard("dispatch", a.job_id) as guard:
            if a.backend in down:
                _unavailable(plane, a, down[a.backend])
                continue
            outcome, why = _dispatch(plane, a, key)
            created += outcome == CREATED
            if outcome == UNAVAILABLE:
                down[a.backend] = why
        if guard.incident is not None:
            _failed(plane, a, guard.incident)
    return created
