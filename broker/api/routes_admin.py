"""/v1/admin: platform operations. Admin tokens only (with `auth: none`, the local caller)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from broker import ledger
from broker.api.auth import Principal, principal
from broker.api.guards import DB_INT_MAX
from broker.api.job_refs import JobRef
from broker.api.problems import Problem, problem_responses
from broker.api.schemas import JobOut
from broker.config import IsthmusConfig
from broker.domain.clock import utcnow
from broker.domain.ids import is_job_id
from broker.domain.notices import redacted
from broker.domain.text import Text
from broker.orchestration import approval
from broker.orchestration.transitions import JobNotFound
from broker.store import approvals
from broker.store import notices as notice_store
from broker.store.conflicts import on_conflict
from broker.store.db import Database
from broker.store.pools import pool_states, set_drained

router = APIRouter(
    prefix="/v1/admin", tags=["admin"], responses=problem_responses(401, 403, 422)
)


async def admin(caller: Annotated[Principal, Depends(principal)]) -> Principal:
    if not caller.is_admin:
        raise Problem(403, "admin-only", "Administrators only",
                      f"{caller.name} is not an admin; this needs an admin token")
    return caller


Admin = Annotated[Principal, Depends(admin)]


class PoolOut(BaseModel):
    name: str
    backend: str
    flavor: str
    drained: bool
    drained_in_config: bool
    reason: str
    changed_by: str | None
    changed_at: str | None


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Text = Field(default="", max_length=1000)


def _pools(request: Request) -> list[PoolOut]:
    config: IsthmusConfig = request.app.state.config
    db: Database = request.app.state.db
    with db.read() as s:
        states = pool_states(s)
    out = []
    for p in config.pools:
        st = states.get(p.name)
        out.append(PoolOut(
            name=p.name, backend=p.backend, flavor=p.flavor,
            drained=p.drained or bool(st and st.drained), drained_in_config=p.drained,
            reason=st.reason if st else "", changed_by=st.actor if st else None,
            changed_at=st.updated_at.isoformat() if st else None,
        ))
    return out


@router.get("/pools", response_model=list[PoolOut])
def pools(request: Request, caller: Admin) -> list[PoolOut]:
    return _pools(request)


@on_conflict
def _write_drained(db: Database, pool: str, drained: bool, reason: str, actor: str) -> None:
    with db.write() as s:
        set_drained(s, pool, drained, reason, actor, utcnow())


def _set(request: Request, pool: str, drained: bool, reason: str, actor: str) -> PoolOut:
    config: IsthmusConfig = request.app.state.config
    if not any(p.name == pool for p in config.pools):
        known = ", ".join(p.name for p in config.pools) or "none"
        raise Problem(404, "pool-not-found", "Pool not found",
                      f"no pool '{pool}' in the configuration; pools: {known}")
    _write_drained(request.app.state.db, pool, drained, reason, actor)
    wake = request.app.state.wake_admission
    if wake is not None:
        wake()  # what admission may hand out changed
    return next(p for p in _pools(request) if p.name == pool)


@router.post(
    "/pools/{pool}/drain", response_model=PoolOut,
    responses=problem_responses(400, 404, 413),
)
def drain(pool: str, body: DrainRequest, request: Request, caller: Admin) -> PoolOut:
    """Admit nothing more to this pool; running jobs keep running."""
    return _set(request, pool, True, body.reason or f"drained by {caller.name}", caller.name)


@router.post(
    "/pools/{pool}/undrain", response_model=PoolOut,
    responses=problem_responses(404),
)
def undrain(pool: str, request: Request, caller: Admin) -> PoolOut:
    return _set(request, pool, False, "", caller.name)


@router.get("/usage")
def usage(request: Request, caller: Admin) -> list[dict[str, object]]:
    """Live quota usage per team and flavor (GPUs reserved, of which borrowed)."""
    db: Database = request.app.state.db
    with db.read() as s:
        rows = ledger.usage(s)
    return [
        {"team": team, "flavor": flavor, "reserved_gpus": g, "borrowed_gpus": b}
        for (team, flavor), (g, b) in sorted(rows.items())
    ]


class ApproveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: Text = Field(default="", max_length=1000, description="shown in the job's event")


class RefuseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Text = Field(min_length=1, max_length=1000,
                         description="why; shown to the job's owner in its message")


def _decide(request: Request, job_id: str, decision: approval.Decision, actor: str,
            note: str) -> JobOut:
    if not is_job_id(job_id):
        raise Problem(404, "job-not-found", "Job not found", f"no job with id '{job_id}'")
    try:
        done = approval.decide(request.app.state.db, request.app.state.config, job_id,
                               decision, actor, note)
    except JobNotFound:
        raise Problem(404, "job-not-found", "Job not found",
                      f"no job with id '{job_id}'") from None
    except approval.ApprovalConflict as exc:
        raise Problem(409, "not-awaiting-approval", "Job is not awaiting approval",
                      str(exc)) from None
    wake = request.app.state.wake_admission
    if wake is not None and decision == "approve":
        wake()  # the job may be admitted now
    return JobOut.of(done.result.job)


@router.post("/jobs/{job_id}/approve", response_model=JobOut,
             responses=problem_responses(400, 404, 409, 413))
def approve(job_id: JobRef, request: Request, caller: Admin,
            body: ApproveRequest | None = None) -> JobOut:
    """Approve a job whose priority class needs approval: it goes to admission (the decision
    is a job event naming the admin and the time). 409 when the job is not QUEUED, needs no
    approval or was already decided."""
    return _decide(request, job_id, "approve", caller.name, body.note if body else "")


@router.post("/jobs/{job_id}/refuse", response_model=JobOut,
             responses=problem_responses(400, 404, 409, 413))
def refuse(job_id: JobRef, body: RefuseRequest, request: Request, caller: Admin) -> JobOut:
    """Refuse a job whose priority class needs approval: it ends CANCELLED with reason
    ApprovalRefused and the admin's reason in its message."""
    return _decide(request, job_id, "refuse", caller.name, body.reason)


@router.get("/approvals", response_model=list[JobOut])
def pending_approvals(request: Request, caller: Admin) -> list[JobOut]:
    """Jobs waiting for an admin's approval (reason AwaitingApproval), oldest first."""
    db: Database = request.app.state.db
    with db.read() as s:
        rows = approvals.awaiting(s)
    return [JobOut.of(r) for r in rows]


class NoticeDeliveryOut(BaseModel):
    id: int
    kind: str
    team: str
    job_id: str | None
    at: str
    channel: str
    target: str = Field(description="a mail address, or a webhook URL shown as scheme://host/...")
    status: str
    attempts: int
    next_try_at: str
    last_error: str
    delivered_at: str | None

    @classmethod
    def of(cls, row: notice_store.Listed) -> NoticeDeliveryOut:
        d = row.delivery
        return cls(id=d.id, kind=row.kind, team=row.team, job_id=row.job_id,
                   at=row.at.isoformat(), channel=d.channel,
                   target=redacted(d.target) if d.channel == notice_store.WEBHOOK else d.target,
                   status=d.status, attempts=d.attempts, next_try_at=d.next_try_at.isoformat(),
                   last_error=d.last_error,
                   delivered_at=d.delivered_at.isoformat() if d.delivered_at else None)


@router.get("/notices", response_model=list[NoticeDeliveryOut])
def notice_deliveries(
    request: Request, caller: Admin,
    status: Annotated[Literal["pending", "delivered", "dead"] | None,
                      Query(description="dead: the dead-letter view")] = None,
    team: Annotated[str | None, Query(max_length=63)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[NoticeDeliveryOut]:
    """Notice deliveries, newest notices first: each target's status, attempts and last
    error. `status=dead` lists the ones whose attempts are spent."""
    db: Database = request.app.state.db
    with db.read() as s:
        rows = notice_store.listing(s, status, team, limit)
    return [NoticeDeliveryOut.of(r) for r in rows]


@router.post("/notices/{delivery_id}/retry", response_model=list[NoticeDeliveryOut],
             responses=problem_responses(404))
def retry_notice(
        delivery_id: Annotated[int, Path(ge=1, le=DB_INT_MAX, description="a delivery's id")],
        request: Request, caller: Admin) -> list[NoticeDeliveryOut]:
    """Give a dead delivery a fresh set of attempts (once its receiver is fixed); the
    leader sends it on its next notices pass. 404 when no dead delivery has this id."""
    db: Database = request.app.state.db
    with db.write() as s:
        if not notice_store.retry_dead(s, delivery_id, utcnow()):
            raise Problem(404, "not-found", "No such dead delivery",
                          f"no dead notice delivery with id {delivery_id}")
    with db.read() as s:
        rows = [r for r in notice_store.listing(s, None, None, 1000)
                if r.delivery.id == delivery_id]
    return [NoticeDeliveryOut.of(r) for r in rows]
