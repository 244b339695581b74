"""bench/lock_waits.py reads PostgreSQL's lock-wait log lines into (waiter, holder, statement)."""

from __future__ import annotations

from bench.lock_waits import waits

LOG = """\
d t UTC_[18359]_[unknown]_LOG:  connection authorized: user=i database=s application_name=c
d t UTC_[200]_b_LOG:  process 200 still waiting for ShareLock on transaction 9 after 25.1 ms
d t UTC_[200]_b_DETAIL:  Process holding the lock: 18359. Wait queue: 200.
d t UTC_[200]_b_CONTEXT:  while updating tuple (5,15) in relation "jobs"
d t UTC_[200]_b_STATEMENT:  UPDATE jobs SET first_useful_work_at=$1
d t UTC_[200]_b_LOG:  process 200 acquired ShareLock on transaction 9 after 105.0 ms
d t UTC_[201]_a_LOG:  process 201 still waiting for ShareLock on transaction 10 after 25.0 ms
d t UTC_[201]_a_DETAIL:  Process holding the lock: 777. Wait queue: 201.
d t UTC_[201]_a_STATEMENT:  SELECT jobs.id FROM jobs FOR UPDATE
d t UTC_[201]_a_LOG:  process 201 acquired ShareLock on transaction 10 after 40.5 ms
d t UTC_[202]_a_LOG:  process 202 still waiting for ShareLock on transaction 11 after 25.0 ms
"""


def test_each_acquired_wait_is_named_by_waiter_holder_and_statement() -> None:
    found = waits(LOG.splitlines())
    assert found == {
        # the holder named from its connection line; a holder never seen keeps its pid
        ("b", "c", "UPDATE jobs SET first_useful_work_at=$1"): [105.0],
        ("a", "777", "SELECT jobs.id FROM jobs FOR UPDATE"): [40.5],
    }  # a wait not yet acquired (202) is not counted
