"""Pure, deterministic policies over snapshots: placement, quota, ordering, admission,
preemption, retry and explain. They import only `broker.domain`; no I/O, no clock."""

from policies.cycle import (
    AdmissionParams,
    CycleRecord,
    CycleResult,
    Decision,
    PreemptionOracle,
    admission_cycle,
)
from policies.explain import Explanation, explain, explain_job
from policies.placement import PlacementParams, PlacementResult, PoolVerdict, ScoreWeights, place
from policies.preemption import PreemptionParams, PreemptionPlan, Preemptor, Victim, select_victims
from policies.retry import AttemptCounts, RetryDecision, RetryParams, decide_retry
from policies.types import (
    FlavorQuota,
    PendingJob,
    QuotaConfig,
    RunningJob,
    TeamQuota,
    Usage,
    decay_usage,
)

__all__ = [
    "AdmissionParams",
    "AttemptCounts",
    "CycleRecord",
    "CycleResult",
    "Decision",
    "Explanation",
    "FlavorQuota",
    "PendingJob",
    "PlacementParams",
    "PlacementResult",
    "PoolVerdict",
    "PreemptionOracle",
    "PreemptionParams",
    "PreemptionPlan",
    "Preemptor",
    "QuotaConfig",
    "RetryDecision",
    "RetryParams",
    "RunningJob",
    "ScoreWeights",
    "TeamQuota",
    "Usage",
    "Victim",
    "admission_cycle",
    "decay_usage",
    "decide_retry",
    "explain",
    "explain_job",
    "place",
    "select_victims",
]
