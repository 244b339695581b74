"""broker.store.conflicts.on_conflict: what is done again, how often, and what is raised."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from sqlalchemy.exc import OperationalError

from broker.store import conflicts
from broker.store.conflicts import ATTEMPTS, conflict, on_conflict


class _Orig(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def _db_error(sqlstate: str) -> OperationalError:
    return OperationalError("UPDATE jobs", {}, _Orig(sqlstate))


def _failing(codes: list[str]) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def write() -> str:
        calls.append(1)
        if len(calls) <= len(codes):
            raise _db_error(codes[len(calls) - 1])
        return "written"

    return calls, write


@pytest.mark.parametrize("code", ["40P01", "40001"])
def test_a_lock_conflict_is_done_again_and_logged_with_the_functions_name(
        code: str, caplog: pytest.LogCaptureFixture) -> None:
    calls, write = _failing([code, code])
    with caplog.at_level(logging.WARNING, logger=conflicts.log.name):
        assert on_conflict(write)() == "written"
    assert len(calls) == 3
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert all("write aborted by a lock conflict" in m for m in messages)
    assert "call 2 of 4" in messages[0] and "call 3 of 4" in messages[1]


def test_the_last_conflict_is_raised_as_it_is_after_attempts_calls() -> None:
    calls, write = _failing(["40P01"] * (ATTEMPTS + 1))
    with pytest.raises(OperationalError) as info:
        on_conflict(write)()
    assert conflict(info.value)
    assert len(calls) == ATTEMPTS


def test_any_other_error_is_raised_at_once() -> None:
    calls, write = _failing(["08006"])  # connection failure: not a conflict
    with pytest.raises(OperationalError):
        on_conflict(write)()
    assert len(calls) == 1
    assert not conflict(ValueError("no orig"))
