from __future__ import annotations

import pytest

from broker.domain import TERMINAL, TRANSITIONS, JobState, is_allowed

S = JobState

# The lifecycle of DESIGN.md section 3, written out independently of the table under test.
EXPECTED = {
    (S.SUBMITTED, S.VALIDATING), (S.SUBMITTED, S.CANCELLED),
    (S.VALIDATING, S.REJECTED), (S.VALIDATING, S.QUEUED), (S.VALIDATING, S.CANCELLED),
    (S.QUEUED, S.ADMITTED), (S.QUEUED, S.CANCELLED), (S.QUEUED, S.QUEUED),
    (S.ADMITTED, S.PREPARING), (S.ADMITTED, S.QUEUED), (S.ADMITTED, S.CANCELLED),
    (S.ADMITTED, S.ADMITTED),
    (S.PREPARING, S.RUNNING), (S.PREPARING, S.RETRYING), (S.PREPARING, S.FAILED),
    (S.PREPARING, S.CANCELLED), (S.PREPARING, S.PREPARING),
    (S.RUNNING, S.SUCCEEDED), (S.RUNNING, S.FAILED), (S.RUNNING, S.CANCELLED),
    (S.RUNNING, S.RETRYING), (S.RUNNING, S.RUNNING),
    (S.FAILED, S.RETRYING),
    (S.RETRYING, S.QUEUED), (S.RETRYING, S.FAILED), (S.RETRYING, S.CANCELLED),
    (S.RETRYING, S.RETRYING),
}


def test_exactly_the_eleven_states() -> None:
    assert [s.value for s in S] == [
        "SUBMITTED", "VALIDATING", "REJECTED", "QUEUED", "ADMITTED", "PREPARING", "RUNNING",
        "SUCCEEDED", "FAILED", "CANCELLED", "RETRYING",
    ]
    assert set(TRANSITIONS) == set(S)


@pytest.mark.parametrize(
    ("src", "dst"), [(a, b) for a in S for b in S], ids=lambda s: s.value
)
def test_table(src: JobState, dst: JobState) -> None:
    assert is_allowed(src, dst) == ((src, dst) in EXPECTED)


def test_terminal_states_have_no_way_out_except_retry_of_failed() -> None:
    for state in TERMINAL:
        outs = {dst for dst in S if is_allowed(state, dst)}
        assert outs == ({S.RETRYING} if state is S.FAILED else set())


def test_every_non_terminal_state_can_be_cancelled() -> None:
    for state in set(S) - TERMINAL:
        assert is_allowed(state, S.CANCELLED)
