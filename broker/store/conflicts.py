"""Transactions PostgreSQL aborted for a lock conflict, done again.

A transaction chosen as a deadlock victim (SQLSTATE 40P01) or refused with a serialization
failure (40001) was rolled back whole: nothing of it stands, so running the same function
again is safe and is what the caller would do. `on_conflict` wraps a function that opens its
own transaction(s) and has no effect outside the database before they commit (effects held
to the commit, broker.store.batch.held_effects): it is called again up to ATTEMPTS times in
all, after a short jittered pause, and the last conflict is raised as it is. Any other error
is raised at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from tenacity import (
    RetryCallState,
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from broker.logs import get_logger

log = get_logger(__name__)

ATTEMPTS = 4
_CONFLICTS = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure

P = ParamSpec("P")
T = TypeVar("T")


def conflict(exc: BaseException) -> bool:
    """Whether `exc` is a transaction PostgreSQL aborted for a lock conflict (to do again)."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) in _CONFLICTS


def _logged(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    name = getattr(state.fn, "__qualname__", "a write")
    log.warning("%s aborted by a lock conflict (%s); done again (call %d of %d)", name,
                type(getattr(exc, "orig", exc)).__name__, state.attempt_number + 1, ATTEMPTS)


def on_conflict(fn: Callable[P, T]) -> Callable[P, T]:
    """`fn`, called again (up to ATTEMPTS calls, 10-200 ms jittered pauses) while it raises
    a lock conflict; each retry is logged as a warning naming `fn`."""
    wrapped: Callable[P, T] = retry(
        retry=retry_if_exception(conflict),
        stop=stop_after_attempt(ATTEMPTS),
        wait=wait_random_exponential(multiplier=0.01, min=0.01, max=0.2),
        before_sleep=_logged,
        reraise=True,
    )(fn)
    return wrapped
