"""Stable reason codes (CamelCase) with a severity ranking.

Every state carries one reason. When several apply (a queued job blocked by quota in one pool
and by capacity in another) the most severe one is shown; `most_severe` picks it
deterministically, breaking ties by code so that the same inputs always give the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from broker.domain.failures import FailureCategory


class ReasonKind(StrEnum):
    PROGRESS = "progress"  # the job moves forward; nothing to act on
    WAIT = "wait"  # the job waits for something outside it
    FAILURE = "failure"  # an attempt ended badly
    REJECTION = "rejection"  # the job can never run as specified
    END = "end"  # a final outcome that is not a failure
    REFUSAL = "refusal"  # why set_state refused a proposal; never stored on a job


class Reason(StrEnum):
    # progress
    Submitted = "Submitted"
    Validating = "Validating"
    WaitingForAdmission = "WaitingForAdmission"
    Admitted = "Admitted"
    BackendPending = "BackendPending"
    PullingImage = "PullingImage"
    WaitingForAllRanks = "WaitingForAllRanks"
    Running = "Running"
    RetryScheduled = "RetryScheduled"
    # waiting
    FairShareBehind = "FairShareBehind"
    HigherPriorityAhead = "HigherPriorityAhead"
    BackoffAfterFailure = "BackoffAfterFailure"
    WaitingForPreemption = "WaitingForPreemption"
    InsufficientCapacity = "InsufficientCapacity"
    TopologyUnsatisfiable = "TopologyUnsatisfiable"
    BorrowLimitReached = "BorrowLimitReached"
    QuotaExhausted = "QuotaExhausted"
    PoolExcluded = "PoolExcluded"
    PoolDrained = "PoolDrained"
    NoFlavorFits = "NoFlavorFits"
    BackendUnavailable = "BackendUnavailable"
    DispatchRefused = "DispatchRefused"
    # attempt failures
    Preempted = "Preempted"
    Orchestration = "Orchestration"
    InfraTransient = "InfraTransient"
    ResourceEnv = "ResourceEnv"
    UserError = "UserError"
    Unknown = "Unknown"
    # rejections (the spec can never run here)
    ExceedsCapacity = "ExceedsCapacity"
    NoPoolOffersFlavor = "NoPoolOffersFlavor"
    NoQuotaInCohort = "NoQuotaInCohort"
    # ends
    Succeeded = "Succeeded"
    CancelledByUser = "CancelledByUser"
    CancelledByAdmin = "CancelledByAdmin"
    RetriesExhausted = "RetriesExhausted"
    # refusals of a proposed transition (outcomes only)
    TransitionNotAllowed = "TransitionNotAllowed"
    RetryNotDecided = "RetryNotDecided"
    # waiting, added after the others (codes are appended, never reordered)
    InternalError = "InternalError"
    # holds before admission (broker.domain.scheduling), and their end
    BeginTimeNotReached = "BeginTimeNotReached"
    WaitingForDependency = "WaitingForDependency"
    JobArrayTaskLimit = "JobArrayTaskLimit"
    DependencyNeverSatisfied = "DependencyNeverSatisfied"
    # a Kubernetes pool in kueue mode: Kueue holds the suspended Job (backends/k8s/kueue.py)
    HeldByKueue = "HeldByKueue"
    # the job names an image and the pool's backend runs none (a Slurm container.runtime: none)
    ImageUnsupported = "ImageUnsupported"
    # REJECTED: the job names an image and no pool that offers its flavors runs images
    NoPoolRunsImages = "NoPoolRunsImages"
    # governance (issue 33): a priority class that needs an admin's approval, and its end
    AwaitingApproval = "AwaitingApproval"
    Approved = "Approved"
    ApprovalRefused = "ApprovalRefused"
    # a team's or a user's concurrency limit (running jobs, GPUs held) keeps the job queued
    ConcurrencyLimit = "ConcurrencyLimit"
    # a GPU-hour budget of its team or user is spent (enforce: stop) until its period renews
    BudgetExhausted = "BudgetExhausted"
    # a user's hold (scontrol hold, sbatch --hold) keeps the job queued until released
    JobHeldUser = "JobHeldUser"
    Requeued = "Requeued"
    # a team queue holds as much of a flavor as its share of the team's quota allows
    QueueShareReached = "QueueShareReached"


@dataclass(frozen=True, slots=True)
class ReasonInfo:
    severity: int
    kind: ReasonKind
    summary: str


R, K = Reason, ReasonKind

REASONS: dict[Reason, ReasonInfo] = {
    R.Submitted: ReasonInfo(0, K.PROGRESS, "accepted by the API"),
    R.Validating: ReasonInfo(0, K.PROGRESS, "checking the spec against the configuration"),
    R.WaitingForAdmission: ReasonInfo(1, K.PROGRESS, "valid; waiting for the next admission cycle"),
    R.Admitted: ReasonInfo(0, K.PROGRESS, "quota reserved and placement chosen"),
    R.BackendPending: ReasonInfo(2, K.PROGRESS, "the backend has the job and has not started it"),
    R.PullingImage: ReasonInfo(2, K.PROGRESS, "ranks are pulling their image"),
    R.WaitingForAllRanks: ReasonInfo(3, K.PROGRESS, "some ranks run, the gang is not complete"),
    R.Running: ReasonInfo(0, K.PROGRESS, "every rank of the gang runs"),
    R.RetryScheduled: ReasonInfo(1, K.PROGRESS, "the retry policy allowed another attempt"),
    R.FairShareBehind: ReasonInfo(10, K.WAIT, "teams with less recent usage go first"),
    R.HigherPriorityAhead: ReasonInfo(15, K.WAIT, "higher-priority jobs are ahead"),
    R.BackoffAfterFailure: ReasonInfo(20, K.WAIT, "waiting out the retry backoff"),
    R.WaitingForPreemption: ReasonInfo(25, K.WAIT, "victims are being preempted to make room"),
    R.InsufficientCapacity: ReasonInfo(30, K.WAIT, "not enough free GPUs in any fitting pool"),
    R.TopologyUnsatisfiable: ReasonInfo(35, K.WAIT, "no topology domain holds the whole gang"),
    R.BorrowLimitReached: ReasonInfo(40, K.WAIT, "the cohort borrowing limit is reached"),
    R.QuotaExhausted: ReasonInfo(45, K.WAIT, "the team's quota for this flavor is used up"),
    R.PoolExcluded: ReasonInfo(46, K.WAIT, "fitting pools are excluded after failures there"),
    R.PoolDrained: ReasonInfo(48, K.WAIT, "the only fitting pools are drained"),
    R.NoFlavorFits: ReasonInfo(50, K.WAIT, "no acceptable flavor is currently offered"),
    R.BackendUnavailable: ReasonInfo(55, K.WAIT, "the backend cannot be reached"),
    R.DispatchRefused: ReasonInfo(56, K.WAIT, "the backend refused the object; placement redone"),
    R.Preempted: ReasonInfo(60, K.FAILURE, "preempted to make room for other work"),
    R.Orchestration: ReasonInfo(65, K.FAILURE, "lost or out-of-sync backend object"),
    R.InfraTransient: ReasonInfo(70, K.FAILURE, "node, network or storage failure"),
    R.ResourceEnv: ReasonInfo(75, K.FAILURE, "driver, image or disk problem"),
    R.UserError: ReasonInfo(80, K.FAILURE, "the job's own code or configuration failed"),
    R.Unknown: ReasonInfo(62, K.FAILURE, "the backend gave no usable evidence"),
    R.ExceedsCapacity: ReasonInfo(90, K.REJECTION, "larger than any pool could ever hold"),
    R.NoPoolOffersFlavor: ReasonInfo(90, K.REJECTION, "no pool offers an acceptable flavor"),
    R.NoQuotaInCohort: ReasonInfo(90, K.REJECTION, "no quota for these flavors in the cohort"),
    R.NoPoolRunsImages: ReasonInfo(
        90, K.REJECTION, "the job names an image and no pool offering its flavors runs images"
    ),
    R.Succeeded: ReasonInfo(0, K.END, "every rank finished successfully"),
    R.CancelledByUser: ReasonInfo(5, K.END, "cancelled by its owner"),
    R.CancelledByAdmin: ReasonInfo(5, K.END, "cancelled by an administrator"),
    R.RetriesExhausted: ReasonInfo(85, K.FAILURE, "no attempts or retry budget left"),
    R.TransitionNotAllowed: ReasonInfo(0, K.REFUSAL, "the lifecycle does not allow this move"),
    R.RetryNotDecided: ReasonInfo(0, K.REFUSAL, "only the retry engine may retry a failed job"),
    R.InternalError: ReasonInfo(
        57, K.WAIT,
        "an unexpected error while handling this job; the message has a correlation id for "
        "the logs",
    ),
    R.BeginTimeNotReached: ReasonInfo(7, K.WAIT, "its start time (--begin) is not reached"),
    R.WaitingForDependency: ReasonInfo(8, K.WAIT, "jobs it depends on have not ended as asked"),
    R.JobArrayTaskLimit: ReasonInfo(9, K.WAIT, "its array runs as many tasks as its % limit"),
    R.DependencyNeverSatisfied: ReasonInfo(
        6, K.END, "cancelled: a job it depends on ended the other way (or does not exist)"
    ),
    R.ImageUnsupported: ReasonInfo(
        47, K.WAIT, "the job names an image; the only fitting pools cannot run images"
    ),
    R.HeldByKueue: ReasonInfo(
        12, K.WAIT, "Kueue has not admitted the Job; the message quotes its Workload's condition"
    ),
    R.JobHeldUser: ReasonInfo(
        10, K.WAIT, "held by a user (scontrol hold, sbatch --hold) until released"
    ),
    R.Requeued: ReasonInfo(
        2, K.PROGRESS, "its owner or an admin requeued it (scontrol requeue): its attempt was "
        "stopped and it waits for admission again"
    ),
    R.AwaitingApproval: ReasonInfo(
        11, K.WAIT, "its priority class needs an admin's approval (isthmus admin approve)"
    ),
    R.Approved: ReasonInfo(1, K.PROGRESS, "an admin approved its priority class; waiting for "
                           "the next admission cycle"),
    R.ApprovalRefused: ReasonInfo(6, K.END, "cancelled: an admin refused its priority class"),
    R.ConcurrencyLimit: ReasonInfo(
        44, K.WAIT, "its team or user runs as many jobs or holds as many GPUs as a limit allows"
    ),
    R.BudgetExhausted: ReasonInfo(
        47, K.WAIT, "a GPU-hour budget of its team or user is spent until its period renews"
    ),
    R.QueueShareReached: ReasonInfo(
        43, K.WAIT, "its team queue holds as much of the flavor as its share of the team's "
        "quota allows"
    ),
}

FAILURE_REASON: dict[FailureCategory, Reason] = {
    FailureCategory.USER_ERROR: R.UserError,
    FailureCategory.INFRA_TRANSIENT: R.InfraTransient,
    FailureCategory.RESOURCE_ENV: R.ResourceEnv,
    FailureCategory.ORCHESTRATION: R.Orchestration,
    FailureCategory.UNKNOWN: R.Unknown,
}


def severity(reason: Reason) -> int:
    return REASONS[reason].severity


def most_severe(reasons: Iterable[Reason]) -> Reason | None:
    """The most severe reason; ties go to the alphabetically first code, for stability."""
    best: Reason | None = None
    for r in reasons:
        if best is None or (severity(r), best.value) > (severity(best), r.value):
            best = r
    return best
