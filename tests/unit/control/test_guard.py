"""The per-job guard: what it swallows, what it lets through, and its correlation ids."""

from __future__ import annotations

import pytest
import sqlalchemy.exc

from broker.control.guard import JobGuard, correlation_id


def test_an_exception_is_kept_as_an_incident_with_a_correlation_id() -> None:
    with JobGuard("dispatch", "job1") as guard:
        raise OverflowError("date value out of range")
    incident = guard.incident
    assert incident is not None and incident.job_id == "job1"
    assert incident.message == (
        f"internal error during dispatch (OverflowError); correlation id "
        f"{incident.correlation} in the broker log"
    )


def test_no_exception_no_incident() -> None:
    with JobGuard("dispatch", "job1") as guard:
        pass
    assert guard.incident is None


def test_the_same_failure_keeps_its_id_and_another_gets_another() -> None:
    a = correlation_id("dispatch", "job1", OverflowError("x"))
    assert a == correlation_id("dispatch", "job1", OverflowError("x"))
    assert a != correlation_id("dispatch", "job2", OverflowError("x"))
    assert a != correlation_id("dispatch", "job1", ValueError("x"))
    assert len(a) == 10


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("gone")),
                     id="database-connection"),
        pytest.param(KeyboardInterrupt(), id="base-exception"),
    ],
)
def test_errors_nobody_is_to_blame_for_are_not_swallowed(error: BaseException) -> None:
    with pytest.raises(type(error)), JobGuard("dispatch", "job1"):
        raise error
