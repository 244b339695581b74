"""broker.store.attempts.insert_facts: the facts of a reconcile chunk stored in one statement,
their ids rising in the order given; on PostgreSQL one text for any number of facts (the rows
as one JSON parameter), so the driver parses it once and the server can prepare it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from broker.store import Database
from broker.store import attempts as att
from tests.fixtures.postgres import POSTGRES_ONLY
from tests.harness.statements import statements_sent


def _facts(n: int, start: int) -> list[att.NewFact]:
    at = datetime(2026, 12, 6, 17, 0, tzinfo=timezone(timedelta(hours=2)))
    return [att.NewFact("sim", f"isthmus-{start + i}", f"j{start + i}", 1 + i % 2, "RUNNING",
                        "", at + timedelta(seconds=i), f'{{"i": {start + i}}}')
            for i in range(n)]


def test_facts_are_stored_with_ids_in_the_order_given(db: Database) -> None:
    facts = _facts(5, 0)[::-1]  # not in key order
    with db.write() as s:
        ids = att.insert_facts(s, facts)
    assert ids == sorted(ids) and len(set(ids)) == 5
    with db.read() as s:
        rows = s.connection().execute(
            sa.select(att.FACTS.c.id, att.FACTS.c.job_id, att.FACTS.c.attempt,
                      att.FACTS.c.observed_at, att.FACTS.c.payload_json)
            .order_by(att.FACTS.c.id)).all()
    assert [(r.id, r.job_id, r.attempt, r.payload_json) for r in rows] == [
        (i, f.job_id, f.attempt, f.payload_json) for i, f in zip(ids, facts, strict=True)]
    # the same instant, in UTC
    assert [r.observed_at for r in rows] == [f.observed_at.astimezone(UTC) for f in facts]


def test_a_naive_time_is_refused(db: Database) -> None:
    fact = _facts(1, 0)[0]._replace(observed_at=datetime(2026, 12, 6, 17, 0))
    with pytest.raises(Exception, match="naive datetime"), db.write() as s:
        att.insert_facts(s, [fact])


@POSTGRES_ONLY
def test_on_postgresql_any_number_of_facts_is_one_text(db: Database) -> None:
    with statements_sent(db.writer) as sent, db.write() as s:
        att.insert_facts(s, _facts(2, 0))
        att.insert_facts(s, _facts(7, 10))
    inserts = [text for text, _ in sent if text.startswith("INSERT INTO facts")]
    assert len(inserts) == 2 and inserts[0] == inserts[1], inserts
