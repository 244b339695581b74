"""/v1/admin: platform operations. Admin tokens only (with `auth: none`, the local caller)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from broker import ledger
from broker.api.auth import Principal, principal
from broker.api.problems import Problem, problem_responses
from broker.config import IsthmusConfig
from broker.domain.clock import utcnow
from broker.domain.text import Text
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
