"""Replay of events equals stored state after random operation sequences; db check finds drift."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from broker import ledger
from broker.cli.main import app
from broker.config import IsthmusConfig
from broker.domain import JobState, Reason
from broker.orchestration import Cause, set_state
from broker.orchestration import replay as replay_module
from broker.orchestration.replay import check_all, replay
from broker.orchestration.submission import cancel_job, submit_job
from broker.store import Database
from broker.store.queries import events_of_jobs, get_job, job_events, list_jobs
from tests.builders import spec

STATES = list(JobState)
HOLDING = {"ADMITTED", "PREPARING", "RUNNING"}


REASONS = [Reason.BackendPending, Reason.QuotaExhausted, Reason.Running, Reason.UserError,
           Reason.Preempted, Reason.Admitted, Reason.RetryScheduled]

op = st.one_of(
    st.tuples(st.just("submit"), st.booleans()),
    st.tuples(st.just("cancel"), st.integers(0, 4)),
    st.tuples(
        st.just("propose"), st.integers(0, 4), st.sampled_from(STATES),
        st.sampled_from(REASONS), st.sampled_from(["api", "retry", "reconciler"]),
        st.one_of(st.none(), st.sampled_from(["k1", "k2", "k3"])),
    ),
)


@settings(
    max_examples=25, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(op, min_size=1, max_size=30))
def test_replay_matches_stored_state(
    db: Database, example_config: IsthmusConfig, ops: list[tuple[Any, ...]]
) -> None:
    jobs: list[str] = []
    for o in ops:
        if o[0] == "submit":
            s = spec().build() if o[1] else spec().replicas(50).build()  # feasible or rejected
            jobs.append(submit_job(db, example_config, s, "prop").job.id)
        elif not jobs:
            continue
        elif o[0] == "cancel":
            cancel_job(db, jobs[o[1] % len(jobs)], "prop", by_admin=False)
        else:
            _, idx, dst, reason, kind, key = o
            details = {"reservation": {"flavor": "a100-80g", "gpus": 8, "borrowed_gpus": idx % 2}}
            with db.write() as sess:
                set_state(
                    sess, jobs[idx % len(jobs)], dst, reason,
                    Cause(kind, "prop", key=key, details=details if idx % 3 else None),
                )
    with db.read() as sess:
        assert list(check_all(sess)) == []
        assert ledger.check(sess) == []
        # every job holding ADMITTED/PREPARING/RUNNING has exactly its 8 GPUs reserved (the
        # database is shared by all examples of this test, so count every job in it)
        holding = list_jobs(sess, states=sorted(HOLDING), limit=100_000)
        reserved = sum(g for g, _ in ledger.usage(sess).values())
        assert reserved == 8 * len(holding)
        for job_id in jobs:
            job = get_job(sess, job_id)
            rep = replay(job_events(sess, job_id))
            assert job is not None
            assert (rep.state, rep.reason, rep.attempt) == (job.state, job.reason, job.attempt)


def test_db_check_cli_reports_drift(db: Database, example_config: IsthmusConfig) -> None:
    job = submit_job(db, example_config, spec().build(), "t").job
    runner = CliRunner()
    ok = runner.invoke(app, ["db", "check", "--db", db.url, "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["mismatches"] == []
    with db.write() as s:  # someone writes the state column directly: exactly what must not happen
        s.connection().exec_driver_sql(
            f"UPDATE jobs SET state = 'RUNNING', attempt = 1 WHERE id = '{job.id}'"
        )
    bad = runner.invoke(app, ["db", "check", "--db", db.url])
    assert bad.exit_code == 1
    flat = bad.output.replace("\n", " ")
    assert f"job {job.id} state: stored='RUNNING' replayed='QUEUED'" in flat
    assert "attempt" in bad.output and "1 jobs: 2 mismatches" in bad.output
    as_json = runner.invoke(app, ["db", "check", "--db", db.url, "--json"])
    assert as_json.exit_code == 1, as_json.output
    assert {"job_id": job.id, "field": "state", "stored": "RUNNING", "replayed": "QUEUED"} in (
        json.loads(as_json.output)["mismatches"])


def test_db_check_reads_one_snapshot_while_a_job_moves(
    db: Database, example_config: IsthmusConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`db check` runs against a live database (the soak runs it while the control loop still
    writes): a transition committed between its read of the jobs and its read of their events
    is no mismatch. On PostgreSQL in READ COMMITTED each statement saw its own snapshot, and
    such a job came out with the events one step ahead of its row."""
    job = submit_job(db, example_config, spec().build(), "t").job
    real = events_of_jobs
    moved: list[str] = []

    def events_after_a_commit(session: Any, ids: list[str]) -> Any:
        if not moved:  # another writer commits between the two reads
            with db.write() as s:
                set_state(s, job.id, JobState.CANCELLED, Reason.CancelledByUser,
                          Cause("api", "t", key="race"))
            moved.append(job.id)
        return real(session, ids)

    monkeypatch.setattr(replay_module, "events_of_jobs", events_after_a_commit)
    out = CliRunner().invoke(app, ["db", "check", "--db", db.url])
    assert moved == [job.id]
    assert out.exit_code == 0, out.output
    assert "1 jobs: 0 mismatches" in out.output
    monkeypatch.undo()  # and the committed move itself replays cleanly
    again = CliRunner().invoke(app, ["db", "check", "--db", db.url, "--json"])
    assert again.exit_code == 0, again.output
