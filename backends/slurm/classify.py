"""Slurm job states and reasons -> Isthmus Phase / Reason / FailureCategory. Pure, table-driven.

Nothing here guesses: a state or end reason that is not in the tables below, or a failure
without evidence of whose fault it was, yields UNKNOWN (phase or category) and keeps the raw
values in the message, so a new Slurm code shows up in `explain` instead of being misfiled.

Node health. When a node of a running job dies, Slurm does not always say NODE_FAIL: a batch
host whose slurmd stops, for one, can end its job FAILED with an exit code such as 13:0 or 1:0.
So a FAILED job is judged together with what is known of its nodes: their state when its end
was first observed and the down / drain / fail events that accounting recorded for them while
it ran (`event_in_run`: never one that was over when the job started; the adapter passes both
in; nothing here calls Slurm). Events matter because a node can
be back in service before anyone looks: with ReturnToService=2 a node set DOWN whose slurmd
still answers is idle again within a second. A node of the allocation that was down, failing,
not responding or in error, or drained by Slurm itself or a health check
(`SLURM_DRAIN_REASONS`), makes the failure INFRA_TRANSIENT and is named in `bad_nodes` and the
message. An admin's drain with any other reason ("kernel upgrade") does not: draining lets
running jobs finish, so it does not explain a job that failed; such a job stays a user error,
with the drain noted in the message. The same job killing its node every time (a kernel OOM,
a process stuck in D state) is then retried as infrastructure; `max_attempts` and the waste
budget bound that, and blaming the user for a dead node would be the worse mistake.

Ranks never launched. The job's code runs only inside the srun step the batch script starts.
A FAILED job whose accounting records no such step (only "batch"/"extern") failed before its
code ran: srun could not reach slurmctld, or Isthmus's batch script failed. That is an
ORCHESTRATION failure, not the user's. While accounting has not recorded the job's end yet,
its steps are unknown and the exit code decides as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from broker.domain.facts import Finding, Phase
from broker.domain.failures import FailureCategory
from broker.domain.reasons import Reason


class PendingCategory(StrEnum):
    """Why Slurm has not started a job, coarsely (the raw reason is kept beside it)."""

    RESOURCES = "resources"  # waiting for nodes / GPUs to free up (Resources, topology)
    PRIORITY = "priority"  # other jobs ahead (Priority, backfill)
    QUOTA = "quota"  # a QOS / association limit (QOSGrpGRES, AssocGrpGRES, ...)
    HELD = "held"  # held by a user or admin, or deferred (--begin)
    DEPENDENCY = "dependency"
    NODES_UNAVAILABLE = "nodes_unavailable"  # requested nodes down / drained / reserved
    PARTITION_UNAVAILABLE = "partition_unavailable"  # partition down or inactive
    NEVER = "never"  # the request can never run here as given (limits, bad constraints)
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ClassifyPolicy:
    """Site policy knobs. OOM is reproducible by default (the same job will OOM again)."""

    oom_is_user_error: bool = True
    infra_drain_reasons: tuple[str, ...] = ()
    """Drain-reason prefixes a site's own health checker sets, on top of SLURM_DRAIN_REASONS."""


@dataclass(frozen=True, slots=True)
class NodeCondition:
    """One observation of a node: its state when a job's end was observed, or a state change
    recorded in accounting while the job ran (``at`` says when, for the message)."""

    state: str  # base state, lower case: idle, allocated, mixed, down, drain, ...
    flags: frozenset[str] = frozenset()  # upper case: DRAIN, NOT_RESPONDING, FAIL, ...
    reason: str = ""
    at: str = ""  # "" for the current state; e.g. "recorded 2026-11-29T14:00:37Z"


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the adapter observed about one job; every field may be missing."""

    state: str  # base state, upper case ("CANCELLED", not "CANCELLED by 0")
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    cancelled_by: str | None = None  # user name (or uid) from "CANCELLED by N"
    own_user: str | None = None  # the user Isthmus submits as
    nodes_allocated: int = 0
    nodes_requested: int = 0
    nodes: tuple[str, ...] = ()  # the allocation
    # Observations of (at least) the allocation's nodes; a node missing here is no evidence.
    node_conditions: Mapping[str, Sequence[NodeCondition]] = field(default_factory=dict)
    # The job's steps in accounting ("batch", "extern", "0", ...); None: not known
    steps: tuple[str, ...] | None = None


PENDING_REASONS: dict[str, PendingCategory] = {
    "None": PendingCategory.PRIORITY,  # not yet evaluated by the scheduler
    "": PendingCategory.PRIORITY,
    "Resources": PendingCategory.RESOURCES,
    "Priority": PendingCategory.PRIORITY,
    "PriorityResv": PendingCategory.PRIORITY,
    "Prolog": PendingCategory.RESOURCES,
    "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_"
    "partitions": PendingCategory.NODES_UNAVAILABLE,
    "ReqNodeNotAvail": PendingCategory.NODES_UNAVAILABLE,
    "NodeDown": PendingCategory.NODES_UNAVAILABLE,
    "Reservation": PendingCategory.NODES_UNAVAILABLE,
    "BeginTime": PendingCategory.HELD,
    "JobHeldUser": PendingCategory.HELD,
    "JobHeldAdmin": PendingCategory.HELD,
    "launch_failed_requeued_held": PendingCategory.HELD,
    "Dependency": PendingCategory.DEPENDENCY,
    "DependencyNeverSatisfied": PendingCategory.NEVER,
    "PartitionDown": PendingCategory.PARTITION_UNAVAILABLE,
    "PartitionInactive": PendingCategory.PARTITION_UNAVAILABLE,
    "PartitionNodeLimit": PendingCategory.NEVER,
    "PartitionTimeLimit": PendingCategory.NEVER,
    "PartitionConfig": PendingCategory.NEVER,
    "BadConstraints": PendingCategory.NEVER,
    "InvalidQOS": PendingCategory.NEVER,
    "InvalidAccount": PendingCategory.NEVER,
    "AccountNotAllowed": PendingCategory.NEVER,
    "QOSJobLimit": PendingCategory.QUOTA,
    "QOSResourceLimit": PendingCategory.QUOTA,
    "QOSTimeLimit": PendingCategory.QUOTA,
    "AssociationJobLimit": PendingCategory.QUOTA,
    "AssociationResourceLimit": PendingCategory.QUOTA,
    "AssociationTimeLimit": PendingCategory.QUOTA,
}
# Slurm's many limit reasons follow these prefixes: QOSGrpGRES, QOSMaxGRESPerUser,
# AssocGrpGRESMinutes, QOSGrpCpuLimit, AssocMaxJobsLimit, MaxGRESPerAccount, ...
QUOTA_PREFIXES = ("QOSGrp", "QOSMax", "QOSMin", "AssocGrp", "AssocMax", "MaxGRES", "MaxCpu",
                  "MaxMem", "MaxNode", "MaxTRES", "GrpGRES", "GrpTRES")

PENDING_REASON_CODE: dict[PendingCategory, Reason] = {
    PendingCategory.RESOURCES: Reason.BackendPending,
    PendingCategory.PRIORITY: Reason.BackendPending,
    PendingCategory.HELD: Reason.BackendPending,
    PendingCategory.DEPENDENCY: Reason.BackendPending,
    PendingCategory.NODES_UNAVAILABLE: Reason.BackendPending,
    PendingCategory.UNKNOWN: Reason.BackendPending,
    PendingCategory.QUOTA: Reason.QuotaExhausted,
    PendingCategory.PARTITION_UNAVAILABLE: Reason.PoolDrained,
    PendingCategory.NEVER: Reason.DispatchRefused,
}

# Terminal states whose category does not depend on exit codes.
_FIXED_END: dict[str, tuple[Phase, Reason, FailureCategory | None, str]] = {
    "NODE_FAIL": (Phase.FAILED, Reason.InfraTransient, FailureCategory.INFRA_TRANSIENT,
                  "a node of the allocation failed"),
    "BOOT_FAIL": (Phase.FAILED, Reason.InfraTransient, FailureCategory.INFRA_TRANSIENT,
                  "a node failed to boot"),
    "TIMEOUT": (Phase.FAILED, Reason.UserError, FailureCategory.USER_ERROR,
                "ran past its time limit (max_runtime)"),
    "DEADLINE": (Phase.FAILED, Reason.UserError, FailureCategory.USER_ERROR,
                 "could not finish before its deadline"),
    "PREEMPTED": (Phase.PREEMPTED, Reason.Preempted, FailureCategory.INFRA_TRANSIENT,
                  "preempted by Slurm"),
    "REVOKED": (Phase.CANCELLED, Reason.Orchestration, FailureCategory.ORCHESTRATION,
                "revoked by a federation sibling"),
}

_ACTIVE: dict[str, tuple[Phase, Reason, str]] = {
    "RUNNING": (Phase.RUNNING, Reason.Running, "every node is allocated and the job runs"),
    "CONFIGURING": (Phase.STARTING, Reason.WaitingForAllRanks, "nodes are being configured"),
    # COMPLETING: the job ended and epilogs run; the final state follows, so wait for it.
    "COMPLETING": (Phase.RUNNING, Reason.Running, "completing (epilog running)"),
    "SIGNALING": (Phase.RUNNING, Reason.Running, "being signalled"),
    "STAGE_OUT": (Phase.RUNNING, Reason.Running, "staging out"),
    "RESIZING": (Phase.RUNNING, Reason.Running, "resizing"),
    "SUSPENDED": (Phase.STARTING, Reason.BackendPending, "suspended by Slurm"),
    "STOPPED": (Phase.STARTING, Reason.BackendPending, "stopped (SIGSTOP)"),
    "REQUEUED": (Phase.PENDING, Reason.BackendPending, "requeued by Slurm"),
    "REQUEUE_HOLD": (Phase.PENDING, Reason.BackendPending, "requeued and held"),
    "REQUEUE_FED": (Phase.PENDING, Reason.BackendPending, "requeued by the federation"),
    "RESV_DEL_HOLD": (Phase.PENDING, Reason.BackendPending, "held: reservation deleted"),
}


# Steps that are not the ranks: the batch shell and the extern step of contained jobs. A job
# whose ranks were launched (by srun) has a numbered step, however fast its code failed.
NON_RANK_STEPS = frozenset({"batch", "extern", "interactive"})
# A node in one of these base states or with one of these flags lost or killed its work.
NODE_FAULT_STATES = frozenset({"down", "fail", "failing", "error"})
NODE_FAULT_FLAGS = frozenset({"NOT_RESPONDING", "FAIL", "FAILING"})
DRAIN_STATES = frozenset({"drain", "drained", "draining"})
DRAIN_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING"})
# Drain reasons that Slurm itself (or the LBNL node health check, "NHC: ...") sets when a node
# misbehaves; compared as case-insensitive prefixes. Any other drain reason is an admin's.
SLURM_DRAIN_REASONS = (
    "Not responding",
    "Kill task failed",  # unkillable processes: usually a hung driver or file system
    "batch job complete failure",
    "Prolog error", "Prolog failed", "Epilog error", "Epilog failed",
    "Node unexpectedly rebooted",
    "reboot timed out",
    "Low RealMemory", "Low socket", "Low CPUs", "Low TmpDisk",  # registered below its config
    "gres/",  # "gres/gpu count reported lower than configured (7 < 8)"
    "Duplicate jobid",
    "SlurmdSpoolDir is full",
    "NHC",
)


def pending_category(reason: str) -> PendingCategory:
    if reason in PENDING_REASONS:
        return PENDING_REASONS[reason]
    if reason.startswith(QUOTA_PREFIXES):
        return PendingCategory.QUOTA
    if reason.startswith("ReqNodeNotAvail"):  # "ReqNodeNotAvail, UnavailableNodes:a100-1"
        return PendingCategory.NODES_UNAVAILABLE
    return PendingCategory.UNKNOWN


def _pending(ev: Evidence) -> Finding:
    category = pending_category(ev.reason)
    note = "" if category is not PendingCategory.UNKNOWN else " (unrecognised Slurm reason)"
    return Finding(
        phase=Phase.PENDING,
        reason=PENDING_REASON_CODE[category],
        message=f"pending in Slurm: {ev.reason or 'None'}{note}",
    )


def _exit_text(ev: Evidence) -> str:
    if ev.signal:
        return f"signal {ev.signal}"
    if ev.exit_code is not None:
        return f"exit code {ev.exit_code}"
    return "no exit code known"


def _describe(name: str, cond: NodeCondition) -> str:
    flags = {f.upper() for f in cond.flags}
    marks = sorted(f.lower() for f in flags & (NODE_FAULT_FLAGS | DRAIN_FLAGS))
    what = "+".join([cond.state.lower() or "unknown", *marks])
    detail = "; ".join(x for x in (cond.reason, cond.at) if x)
    return f"{name} {what} ({detail})" if detail else f"{name} {what}"


def event_in_run(event_start: datetime | None, event_end: datetime | None, run_start: datetime,
                 run_end: datetime, slack: timedelta) -> bool:
    """Whether a node event that accounting recorded (from ``event_start`` to ``event_end``;
    None: not over, or not yet recorded as over) can explain the end of a job that ran on that
    node from ``run_start`` to ``run_end``.

    It can if it began while the job ran, or up to ``slack`` after its end (the event and the
    end are stamped apart, in whole seconds); not if it began later (the next job's). One that
    began before the job started counts only if its recorded end falls after the start: Slurm
    allocates no down, drained or failing node, so a node in the allocation was back in service
    when the job started. Hence an event that ended in the second the job started (times are
    whole seconds, and a pending job gets a node the moment it returns) and an event from
    before the start whose end is not recorded (slurmdbd lags behind slurmctld, or an end was
    lost) are another job's story, never this one's. An event of unknown start proves nothing.
    """
    if event_start is None or event_start > run_end + slack:
        return False
    if event_start >= run_start:
        return True
    return event_end is not None and event_end > run_start


def node_fault(cond: NodeCondition, policy: ClassifyPolicy) -> bool | None:
    """True: the node failed (its work was lost or killed). False: drained by an admin, which
    does not explain a failed job. None: nothing unusual."""
    flags = {f.upper() for f in cond.flags}
    state = cond.state.lower()
    if state in NODE_FAULT_STATES or flags & NODE_FAULT_FLAGS:
        return True
    if state in DRAIN_STATES or flags & DRAIN_FLAGS:
        prefixes = tuple(p.lower() for p in (*SLURM_DRAIN_REASONS, *policy.infra_drain_reasons))
        return cond.reason.strip().lower().startswith(prefixes)
    return None


@dataclass(frozen=True, slots=True)
class _NodeVerdicts:
    failed: dict[str, str]  # node name -> "name state (reason)", in allocation order
    drained: dict[str, str]  # drained by an admin: noted, not blamed


def _node_verdicts(ev: Evidence, policy: ClassifyPolicy) -> _NodeVerdicts:
    """A node failed if any observation of it says so (the first such one describes it)."""
    out = _NodeVerdicts({}, {})
    for name in ev.nodes:
        for cond in ev.node_conditions.get(name, ()):
            verdict = node_fault(cond, policy)
            if verdict:
                out.failed[name] = _describe(name, cond)
                out.drained.pop(name, None)
                break
            if verdict is False:
                out.drained.setdefault(name, _describe(name, cond))
    return out


def _failed(ev: Evidence, policy: ClassifyPolicy) -> Finding:
    nodes = _node_verdicts(ev, policy)
    if nodes.failed:
        return Finding(
            Phase.FAILED, Reason.InfraTransient, FailureCategory.INFRA_TRANSIENT,
            message=f"FAILED with {_exit_text(ev)} while its node(s) failed: "
            f"{', '.join(nodes.failed.values())}; a node failure, not the job's",
            bad_nodes=tuple(nodes.failed))
    if ev.steps is not None and not set(ev.steps) - NON_RANK_STEPS:
        return Finding(
            Phase.FAILED, Reason.Orchestration, FailureCategory.ORCHESTRATION,
            message=f"FAILED with {_exit_text(ev)} before any rank started (job steps in "
            f"accounting: {', '.join(ev.steps) or 'none'}): srun could not launch the ranks "
            "(slurmctld unreachable, for one) or the batch script failed before it; the job's "
            "code never ran")
    got = _failed_by_exit(ev)
    if nodes.drained:
        note = ", ".join(nodes.drained.values())
        got = replace(got, message=f"{got.message} (drained by an admin, not counted as a "
                      f"node failure: {note})")
    return got


def _failed_by_exit(ev: Evidence) -> Finding:
    if ev.exit_code is not None and ev.exit_code > 0:
        return Finding(Phase.FAILED, Reason.UserError, FailureCategory.USER_ERROR,
                              message=f"the job's script failed with exit code {ev.exit_code}")
    if ev.reason == "NonZeroExitCode":  # Slurm saw a non-zero exit even if we lack the code
        return Finding(Phase.FAILED, Reason.UserError, FailureCategory.USER_ERROR,
                              message="the job's script exited non-zero (code unknown)")
    if ev.reason in ("JobLaunchFailure", "Prolog", "launch_failed_requeued_held"):
        return Finding(Phase.FAILED, Reason.ResourceEnv, FailureCategory.RESOURCE_ENV,
                              message=f"Slurm could not launch the job ({ev.reason}, "
                              f"{_exit_text(ev)})")
    return Finding(Phase.FAILED, Reason.Unknown, FailureCategory.UNKNOWN,
                          message=f"FAILED with {_exit_text(ev)}, reason "
                          f"{ev.reason or 'None'}: no evidence whose fault it was")


def _cancelled(ev: Evidence) -> Finding:
    who = ev.cancelled_by
    if who is None or (ev.own_user is not None and who == ev.own_user):
        return Finding(Phase.CANCELLED, Reason.CancelledByUser,
                              message="cancelled through Isthmus" if who else "cancelled",
                              actor=None)
    return Finding(Phase.CANCELLED, Reason.CancelledByAdmin,
                          message=f"cancelled in Slurm by {who}", actor=who)


def classify(ev: Evidence, policy: ClassifyPolicy | None = None) -> Finding:
    """Map one job's evidence to a Finding (with the raw state, reason, exit code, signal and
    nodes of the evidence). Pure; see the tables above."""
    got = _judged(ev, policy or ClassifyPolicy())
    return replace(got, raw_state=ev.state, raw_reason=ev.reason, exit_code=ev.exit_code,
                   signal=ev.signal, nodes=ev.nodes)


def _judged(ev: Evidence, policy: ClassifyPolicy) -> Finding:
    state = ev.state.upper()
    if state == "PENDING":
        return _pending(ev)
    if state in _ACTIVE:
        return _active(ev, state)
    if state == "COMPLETED":
        if ev.exit_code not in (None, 0) or ev.signal:
            return Finding(Phase.UNKNOWN, Reason.Unknown, FailureCategory.UNKNOWN,
                           message=f"COMPLETED but {_exit_text(ev)}")
        return Finding(Phase.SUCCEEDED, Reason.Succeeded, message="completed")
    if state == "FAILED":
        return _failed(ev, policy)
    if state == "OUT_OF_MEMORY":
        if policy.oom_is_user_error:
            return Finding(Phase.FAILED, Reason.UserError, FailureCategory.USER_ERROR,
                           message="out of memory (reproducible: the job asks too much)")
        return Finding(Phase.FAILED, Reason.ResourceEnv, FailureCategory.RESOURCE_ENV,
                       message="out of memory (site policy: environment problem)")
    if state == "CANCELLED":
        return _cancelled(ev)
    if state in _FIXED_END:
        return _fixed_end(ev, state, policy)
    return Finding(Phase.UNKNOWN, Reason.Unknown, None,
                   message=f"unrecognised Slurm state {ev.state!r}")


def _active(ev: Evidence, state: str) -> Finding:
    phase, reason, text = _ACTIVE[state]
    if state == "RUNNING" and ev.nodes_requested and ev.nodes_allocated < ev.nodes_requested:
        return Finding(Phase.STARTING, Reason.WaitingForAllRanks,
                       message=f"{ev.nodes_allocated}/{ev.nodes_requested} nodes")
    return Finding(phase, reason, message=text)


def _fixed_end(ev: Evidence, state: str, policy: ClassifyPolicy) -> Finding:
    phase, reason, failure, text = _FIXED_END[state]
    got = Finding(phase, reason, failure, message=f"{text} ({_exit_text(ev)})")
    if failure is FailureCategory.INFRA_TRANSIENT and phase is Phase.FAILED:
        failed = _node_verdicts(ev, policy).failed
        if failed:  # name the culprits when the node list shows them
            got = replace(got, message=f"{got.message}: {', '.join(failed.values())}",
                          bad_nodes=tuple(failed))
    return got
