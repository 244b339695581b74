"""An admin's decision on a job whose priority class says `approval: required`.

Approving moves the job QUEUED -> QUEUED with reason Approved (the next admission cycle's hold
phase lets it through); refusing ends it CANCELLED with ApprovalRefused (QUEUED -> REJECTED is
not in the lifecycle). Either way through set_state, with the cause key
`broker.store.approvals.APPROVAL_KEY`, so the decision is one job event naming who and when,
and a job is decided once: a second decision is refused (`ApprovalConflict`), not applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from broker.config import IsthmusConfig
from broker.domain import JobState, Reason
from broker.orchestration.rules import Cause, Outcome
from broker.orchestration.transitions import JobNotFound, TransitionResult, set_state
from broker.store import approvals, batch, records
from broker.store.conflicts import on_conflict
from broker.store.db import Database

Decision = Literal["approve", "refuse"]


class ApprovalConflict(Exception):
    """The job cannot be decided on now (the message says why); the API answers 409."""


@dataclass(frozen=True, slots=True)
class Decided:
    result: TransitionResult
    decision: Decision


@on_conflict  # a deadlock victim is decided again: its aborted transaction left nothing
def decide(db: Database, config: IsthmusConfig, job_id: str, decision: Decision, actor: str,
           note: str) -> Decided:
    """Approve or refuse `job_id` as `actor`; `note` is the reason (required to refuse)."""
    with db.write() as s, batch.held_effects(s) as effects:
        job = records.lock_job(s, job_id)
        if job is None:
            raise JobNotFound(job_id)
        pc = config.priority_class(job.priority)
        if pc is None or pc.approval != "required":
            raise ApprovalConflict(
                f"job {job_id} has priority class '{job.priority}', which needs no approval")
        done = approvals.decisions(s, [job_id]).get(job_id)
        if done is not None:
            verb = "approved" if done.reason == Reason.Approved.value else "refused"
            raise ApprovalConflict(
                f"job {job_id} was already {verb} by {done.actor} at {done.at.isoformat()}")
        if job.state != JobState.QUEUED.value:
            raise ApprovalConflict(
                f"job {job_id} is {job.state}; only a QUEUED job is approved or refused"
                + (" (it is queued once validated: try again in a moment)"
                   if job.state in (JobState.SUBMITTED.value, JobState.VALIDATING.value)
                   else ""))
        cause = Cause("admin", actor, key=approvals.APPROVAL_KEY,
                      details={"decision": decision, "by": actor, "note": note})
        said = f": {note}" if note else ""
        if decision == "approve":
            result = set_state(s, job_id, JobState.QUEUED, Reason.Approved, cause,
                               f"priority class '{pc.name}' approved by {actor}{said}",
                               locked=job)
        else:
            result = set_state(s, job_id, JobState.CANCELLED, Reason.ApprovalRefused, cause,
                               f"priority class '{pc.name}' refused by {actor}{said}",
                               locked=job)
        if result.outcome is not Outcome.ACCEPT:
            raise ApprovalConflict(f"job {job_id}: {result.message}")
    effects.run_effects()  # the transition's metrics, once it committed
    return Decided(result, decision)
