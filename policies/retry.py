"""The retry engine: (policy, failure category, attempt counts, GPU-hours wasted) -> decision.

Pure: the caller applies the decision (RETRYING -> QUEUED with `not_before`, exclusions on the
next attempt's pending view). Checks, in this order; the first that decides wins:

1. Preemption (`preempted=True`): not a failure and does not consume `max_attempts`; retried at
   once unless the job was preempted more than `max_preemptions` times -> RetriesExhausted.
2. USER_ERROR: never retried; the same code would fail again -> UserError.
3. Attempts: `counts.failures` (failed attempts so far, this one included) has reached the
   policy's `max_attempts` -> RetriesExhausted.
4. Waste: GPU-hours wasted by failed attempts exceed the policy's `max_wasted_gpu_hours`
   -> RetriesExhausted.
5. Category budgets: ORCHESTRATION is retried once (`orchestration_retries`); UNKNOWN once
   (`unknown_retries`) -> RetriesExhausted past that.
6. Otherwise retry, with an exponential backoff `backoff * 2^(failures-1)` capped at
   `max_backoff`, and exclusions by category:
   INFRA_TRANSIENT excludes the failing node(s), and the pool once it failed there
   `infra_pool_exclude_after` times or when no node is known; RESOURCE_ENV retries only
   elsewhere (pool and nodes excluded); ORCHESTRATION excludes nothing (the object was lost,
   not the hardware); UNKNOWN excludes the node(s).

UNKNOWN, by judgement: missing evidence may hide a user error, so it gets one retry (not the
full budget), and its node is avoided in case it was the hardware. A second unknown failure
stops, leaving the decision to a human with the facts at hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from broker.domain.failures import FailureCategory
from broker.domain.reasons import FAILURE_REASON, Reason
from broker.domain.spec import RetryPolicy

C = FailureCategory


@dataclass(frozen=True, slots=True)
class AttemptCounts:
    failures: int = 0
    """Failed attempts so far, this one included; preemptions not counted."""
    preemptions: int = 0
    """Attempts ended by preemption, this one included."""
    by_category: Mapping[FailureCategory, int] = field(default_factory=dict)
    """Failed attempts per category, this one included."""
    failures_in_pool: int = 0
    """Failed attempts in the pool of this attempt, this one included."""


@dataclass(frozen=True, slots=True)
class RetryParams:
    max_preemptions: int = 10
    orchestration_retries: int = 1
    unknown_retries: int = 1
    preemption_delay_s: int = 0
    infra_pool_exclude_after: int = 2


@dataclass(frozen=True, slots=True)
class RetryDecision:
    retry: bool
    delay_seconds: int
    exclude_pools: frozenset[str]
    exclude_nodes: frozenset[str]
    reason: Reason
    message: str
    counts_as_failure: bool


def backoff_delay(policy: RetryPolicy, failures: int) -> int:
    n = max(1, failures)
    # cap the exponent so that huge counts cannot overflow into giant ints
    return int(min(policy.max_backoff, policy.backoff * (2 ** min(n - 1, 30))))


def _stop(reason: Reason, message: str, failure: bool = True) -> RetryDecision:
    return RetryDecision(False, 0, frozenset(), frozenset(), reason, message, failure)


def decide_retry(
    policy: RetryPolicy,
    category: FailureCategory | None,
    counts: AttemptCounts,
    wasted_gpu_hours: float,
    *,
    preempted: bool = False,
    pool: str | None = None,
    nodes: Sequence[str] = (),
    params: RetryParams | None = None,
) -> RetryDecision:
    """Decide whether the attempt that just ended is retried (see the module docstring)."""
    p = params or RetryParams()
    if preempted:
        return _after_preemption(counts, p)
    cat = category or C.UNKNOWN
    stop = _budget_spent(policy, cat, counts, wasted_gpu_hours, p)
    if stop is not None:
        return stop
    ex_pools, ex_nodes = _avoid(cat, counts, pool, nodes, p)
    where = ""
    if ex_pools or ex_nodes:
        parts = [f"pool {x}" for x in sorted(ex_pools)] + [f"node {x}" for x in sorted(ex_nodes)]
        where = f"; avoiding {', '.join(parts)}"
    delay = backoff_delay(policy, counts.failures)
    return RetryDecision(
        True,
        delay,
        ex_pools,
        ex_nodes,
        FAILURE_REASON[cat],
        f"{cat.value}: retry {counts.failures + 1} of {policy.max_attempts} in {delay}s{where}",
        True,
    )


def _after_preemption(counts: AttemptCounts, p: RetryParams) -> RetryDecision:
    """A preempted job is requeued without spending its attempt budget, up to a limit."""
    if counts.preemptions > p.max_preemptions:
        return _stop(
            Reason.RetriesExhausted,
            f"preempted {counts.preemptions} times, over the limit of {p.max_preemptions}",
            failure=False,
        )
    return RetryDecision(
        True,
        p.preemption_delay_s,
        frozenset(),
        frozenset(),
        Reason.Preempted,
        f"preempted ({counts.preemptions} of {p.max_preemptions} allowed); requeued, "
        "attempt budget untouched",
        False,
    )


def _budget_spent(policy: RetryPolicy, cat: FailureCategory, counts: AttemptCounts,
                  wasted_gpu_hours: float, p: RetryParams) -> RetryDecision | None:
    """Why a failure is not retried (user error, attempts, wasted GPU-hours, the
    category's own budget, in this order), or None."""
    if cat is C.USER_ERROR:
        return _stop(Reason.UserError, "user error: not retried, the same code would fail again")
    if counts.failures >= policy.max_attempts:
        return _stop(
            Reason.RetriesExhausted,
            f"{counts.failures} failed attempts, the policy allows {policy.max_attempts} "
            f"(last: {cat.value})",
        )
    cap = policy.max_wasted_gpu_hours
    if cap is not None and wasted_gpu_hours > cap:
        return _stop(
            Reason.RetriesExhausted,
            f"{wasted_gpu_hours:.1f} GPU-hours wasted by failed attempts, over the budget of "
            f"{cap:g}",
        )
    budget = {C.ORCHESTRATION: p.orchestration_retries, C.UNKNOWN: p.unknown_retries}.get(cat)
    seen = counts.by_category.get(cat, 1)
    if budget is not None and seen > budget:
        return _stop(
            Reason.RetriesExhausted,
            f"{seen} {cat.value} failures; this category is retried {budget} time(s)",
        )
    return None


def _avoid(cat: FailureCategory, counts: AttemptCounts, pool: str | None,
           nodes: Sequence[str], p: RetryParams) -> tuple[frozenset[str], frozenset[str]]:
    """(pools, nodes) the retry avoids: the blamed nodes, the pool after repeated infra
    failures there (or with no node to blame) or a resource/environment failure, nothing
    after an orchestration failure."""
    ex_nodes = frozenset(nodes)
    ex_pools: frozenset[str] = frozenset()
    if cat is C.INFRA_TRANSIENT:
        if pool and (not nodes or counts.failures_in_pool >= p.infra_pool_exclude_after):
            ex_pools = frozenset({pool})
    elif cat is C.RESOURCE_ENV:
        ex_pools = frozenset({pool}) if pool else frozenset()
    elif cat is C.ORCHESTRATION:
        ex_nodes = frozenset()
    return ex_pools, ex_nodes
