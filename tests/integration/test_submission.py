"""Group commit of submissions: one transaction, one failure does not sink the others."""

from __future__ import annotations

from broker.config import IsthmusConfig
from broker.orchestration.replay import check_all
from broker.orchestration.submission import (
    IdempotencyConflict,
    Submission,
    Submitted,
    submit_job,
    submit_many,
)
from broker.store import Database
from broker.store.queries import list_jobs
from tests.builders import spec


def test_batch_with_conflict_and_duplicate_keys(
    db: Database, example_config: IsthmusConfig
) -> None:
    first = submit_job(db, example_config, spec().build(), "a", "k0").job
    batch = [
        Submission(spec().name("one").build(), "a"),
        Submission(spec().name("other-body").build(), "a", "k0"),  # key reused, new body
        Submission(spec().name("two").build(), "a", "k1"),
        Submission(spec().name("two").build(), "a", "k1"),  # same key and body in one batch
        Submission(spec().replicas(50).build(), "a"),  # stored, then rejected
    ]
    results = submit_many(db, example_config, batch)
    assert isinstance(results[1], IdempotencyConflict) and results[1].job_id == first.id
    ok = [r for r in results if isinstance(r, Submitted)]
    assert [r.created for r in ok] == [True, True, False, True]
    assert ok[1].job.id == ok[2].job.id
    assert ok[3].job.state == "REJECTED"
    with db.read() as s:
        assert len(list_jobs(s, limit=100)) == 4
        assert list(check_all(s)) == []
