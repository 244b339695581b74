"""`isthmus db backup` and `isthmus db restore` on both databases, as an operator runs them:
a backup taken while jobs exist, later changes, a restore that brings back exactly the backup's
jobs and events, and a database that replays clean afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.domain import JobState, Reason
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.store import Database, open_database
from broker.store.queries import get_job, job_events, list_jobs
from tests.builders import insert_job_in_state

pytestmark = pytest.mark.slow  # over two seconds each: out of the fast tier (README)


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ISTHMUS_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "broker.cli.main", "db", *args],
                          capture_output=True, text=True, timeout=120, env=env, check=False)


def _queued(db: Database) -> str:
    """A job taken to QUEUED through set_state, so that its events replay to its row."""
    with db.write() as s:
        job_id = insert_job_in_state(s, JobState.SUBMITTED, Reason.Submitted)
        set_state(s, job_id, JobState.VALIDATING, Reason.Validating, Cause("api", "u"))
        set_state(s, job_id, JobState.QUEUED, Reason.WaitingForAdmission, Cause("api", "u"))
    return job_id


def _jobs(db: Database) -> dict[str, tuple[str, int]]:
    with db.read() as s:
        return {j.id: (j.state, len(job_events(s, j.id))) for j in list_jobs(s, limit=100)}


def test_backup_then_restore_brings_back_the_backup(db_url: str, tmp_path: Path) -> None:
    db = open_database(db_url)
    try:
        kept = _queued(db)
        before = _jobs(db)
        dump = tmp_path / "isthmus.backup"
        out = _cli(db_url, "backup", str(dump))
        assert out.returncode == 0, out.stdout + out.stderr
        assert dump.stat().st_size > 0
        again = _cli(db_url, "backup", str(dump))  # never overwritten by accident
        assert again.returncode != 0 and "--force" in again.stderr + again.stdout
        with db.write() as s:  # life goes on after the backup
            set_state(s, kept, JobState.CANCELLED, Reason.CancelledByUser, Cause("api", "u"))
        _queued(db)
        assert _jobs(db) != before
        unconfirmed = _cli(db_url, "restore", str(dump))
        assert unconfirmed.returncode != 0 and "--yes" in unconfirmed.stderr + unconfirmed.stdout
        db.dispose()
        out = _cli(db_url, "restore", "--yes", str(dump))
        assert out.returncode == 0, out.stdout + out.stderr
        db = open_database(db_url, migrate=False)
        assert _jobs(db) == before
        with db.read() as s:
            job = get_job(s, kept)
            assert job is not None and job.state == JobState.QUEUED
        out = _cli(db_url, "check")
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        db.dispose()


def test_restore_of_a_file_that_is_not_a_backup_changes_nothing(
    db_url: str, tmp_path: Path
) -> None:
    db = open_database(db_url)
    try:
        _queued(db)
        before = _jobs(db)
        junk = tmp_path / "junk.backup"
        junk.write_bytes(b"this is not a database backup\n" * 100)
        out = _cli(db_url, "restore", "--yes", str(junk))
        assert out.returncode != 0
        assert "error" in out.stderr + out.stdout
        assert _jobs(db) == before
    finally:
        db.dispose()
