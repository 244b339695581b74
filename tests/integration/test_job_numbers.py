"""Numeric job ids (revision 0015, broker/store/job_numbers.py): every job gets a number at
submit, never given twice, from one sequence shared by all replicas; the jobs API takes the
number and ARRAY_TASK wherever it takes an id. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.config import IsthmusConfig
from broker.orchestration.submission import Submission, submit_job, submit_many
from broker.store import job_numbers, migrate, open_database
from broker.store.db import Database, connect
from broker.store.queries import get_job
from broker.store.records import JOBS
from tests.builders import spec

T0 = datetime(2026, 11, 30, 9, tzinfo=UTC)


@pytest.fixture
def client(db: Database, example_config: IsthmusConfig) -> Iterator[TestClient]:
    with TestClient(create_app(example_config, db)) as c:
        yield c


def _old_job(job_id: str, minutes: int,
             array: dict[str, object] | None = None) -> dict[str, object]:
    spec_data: dict[str, object] = {"name": "j"}
    if array is not None:
        spec_data["scheduling"] = {"array": array}
    at = T0 + timedelta(minutes=minutes)
    return {"id": job_id, "name": "j", "team": "vision", "queue": "default",
            "priority": "normal", "state": "QUEUED", "reason": "Queued", "message": "",
            "attempt": 0, "last_seq": 1, "total_gpus": 8, "spec_json": json.dumps(spec_data),
            "spec_hash": "x" * 64, "submitted_by": "u", "created_at": at, "updated_at": at,
            "exclude_json": "{}"}


def test_migration_numbers_existing_jobs_in_submit_order_and_new_ones_after_them(
    empty_url: str, example_config: IsthmusConfig
) -> None:
    db = connect(empty_url)
    try:
        migrate.upgrade(db, "0014")
        with db.write() as s:  # inserted out of submit order; an array of two tasks
            s.connection().execute(sa.insert(JOBS), [
                _old_job("0000000000000003", 3, {"id": "06h45bf8fa8cbxq6", "index": 5,
                                                 "count": 2}),
                _old_job("0000000000000001", 1),
                _old_job("0000000000000002", 2, {"id": "06h45bf8fa8cbxq6", "index": 4,
                                                 "count": 2}),
            ])
        migrate.upgrade(db)
        with db.read() as s:
            rows = {r.id: r for r in s.connection().execute(
                sa.select(JOBS.c.id, JOBS.c.number, JOBS.c.array_number, JOBS.c.array_index))}
            assert [rows[f"000000000000000{i}"].number for i in (1, 2, 3)] == [1, 2, 3]
            # the array's number is its lowest task's: ARRAY_TASK finds each task
            assert job_numbers.resolve(s, "2_4") == "0000000000000002"
            assert job_numbers.resolve(s, "2_5") == "0000000000000003"
            assert job_numbers.resolve(s, "3") == "0000000000000003"
        new = submit_job(db, example_config, spec().build(), "a").job
        assert new.number == 4  # the sequence starts after the numbered jobs
    finally:
        db.dispose()


def test_each_submission_gets_its_own_number_and_the_number_finds_it(
    db: Database, example_config: IsthmusConfig
) -> None:
    one = submit_job(db, example_config, spec().build(), "a").job
    batch = submit_many(db, example_config, [Submission(spec().name(f"b{i}").build(), "a")
                                             for i in range(3)])
    again = submit_job(db, example_config, spec().build(), "a", "k").job
    replay = submit_job(db, example_config, spec().build(), "a", "k").job
    numbers = [one.number, *[r.job.number for r in batch if not isinstance(r, Exception)],
               again.number]
    assert None not in numbers
    drawn = [n for n in numbers if n is not None]
    assert len(set(drawn)) == 5 and drawn == sorted(drawn)
    assert replay.number == again.number  # an idempotent replay is the same job
    with db.read() as s:
        for job_id, number in ((one.id, one.number), (again.id, again.number)):
            assert job_numbers.resolve(s, str(number)) == job_id
            stored = get_job(s, job_id)
            assert stored is not None and stored.number == number
        assert job_numbers.resolve(s, "999999") is None
        assert job_numbers.resolve(s, "4294967295") is None  # not a 32-bit job id
        assert job_numbers.resolve(s, one.id) == one.id


def test_numbers_are_unique_across_replicas_under_concurrent_submits(
    db_url: str, db: Database, example_config: IsthmusConfig
) -> None:
    """Two replicas (two engines on one database) submitting at once never share a number."""
    other = open_database(db_url, sqlite_synchronous="NORMAL")
    got: list[int] = []
    lock = threading.Lock()

    def submit_from(replica: Database, prefix: str) -> None:
        for i in range(10):
            job = submit_job(replica, example_config, spec().name(f"{prefix}{i}").build(),
                             "a").job
            assert job.number is not None
            with lock:
                got.append(job.number)

    try:
        threads = [threading.Thread(target=submit_from, args=(r, p))
                   for r, p in ((db, "x"), (other, "y"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        other.dispose()
    assert len(got) == 20 and len(set(got)) == 20


def test_a_block_is_numbers_never_given_again(db: Database) -> None:
    with db.write() as s:
        block = job_numbers.allocate(s, 5)
    with db.write() as s:
        after = job_numbers.allocate(s)
    assert len(set(block)) == 5 and after[0] > max(block)
    with pytest.raises(ValueError, match="count"), db.write() as s:
        job_numbers.allocate(s, job_numbers.MAX_BLOCK + 1)


def test_the_jobs_api_takes_the_number_and_array_task_wherever_it_takes_an_id(
    client: TestClient, db: Database
) -> None:
    made = client.post("/v1/jobs", json=spec().team("vision").dict()).json()
    number = made["number"]
    assert isinstance(number, int)
    for path in ("", "/events", "/explain", "/attempts", "/timeline"):
        r = client.get(f"/v1/jobs/{number}{path}")
        assert r.status_code == 200, (path, r.text)
    assert client.get(f"/v1/jobs/{number}").json()["id"] == made["id"]
    assert client.get(f"/v1/jobs/{made['id']}").json()["number"] == number
    assert client.get("/v1/jobs/4294967").status_code == 404
    assert client.get(f"/v1/jobs/{number}_0").status_code == 404  # not an array task
    assert client.post(f"/v1/jobs/{number}/cancel").json()["state"] == "CANCELLED"


def test_downgrade_forgets_the_numbers_and_upgrade_numbers_again(
    empty_url: str, example_config: IsthmusConfig
) -> None:
    db = connect(empty_url)
    try:
        migrate.upgrade(db)
        first = submit_job(db, example_config, spec().build(), "a").job
        migrate.downgrade(db, "0014")
        migrate.upgrade(db)
        with db.read() as s:
            again = get_job(s, first.id)
        assert again is not None and again.number == 1
        assert submit_job(db, example_config, spec().build(), "a").job.number == 2
    finally:
        db.dispose()
