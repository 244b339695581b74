"""broker.store.in_lists: look-ups by many keys find the same rows on both databases; on
PostgreSQL the keys are bound as arrays, so the statement sent is the same text whatever the
number of keys (the driver and the server keep its parsed and prepared forms)."""

from __future__ import annotations

import sqlalchemy as sa

from broker.store import attempts as att
from broker.store.queries import jobs_by_ids
from tests.builders import spec
from tests.harness.sim import Sim, run_until, submit


def _sent(sim: Sim, look_up: object) -> list[str]:
    texts: list[str] = []

    def keep(conn: object, cursor: object, statement: str, *args: object) -> None:
        texts.append(statement)

    sa.event.listen(sim.plane.db.reader, "before_cursor_execute", keep)
    try:
        assert callable(look_up)
        look_up()
    finally:
        sa.event.remove(sim.plane.db.reader, "before_cursor_execute", keep)
    return texts


def test_look_ups_by_many_keys_find_their_rows_with_one_statement_text(sim: Sim) -> None:
    jobs = [submit(sim, spec().name(f"k{i}").flavors("a100-80g").replicas(1).topology(None), 600)
            for i in range(4)]
    for j in jobs:
        run_until(sim, j, "RUNNING", step=10)
    missing = [f"nojob{i}" for i in range(80)]
    with sim.plane.db.read() as s:
        assert set(jobs_by_ids(s, jobs[:1])) == {jobs[0]}
        assert set(jobs_by_ids(s, jobs + missing)) == set(jobs)
        keys = [(j, 1) for j in jobs] + [(jobs[0], 2)] + [(m, 1) for m in missing]
        assert [(a.job_id, a.number) for a in att.by_keys(s, keys)] == [(j, 1) for j in jobs]

    def one() -> None:
        with sim.plane.db.read() as s:
            jobs_by_ids(s, jobs[:1])
            att.by_keys(s, [(jobs[0], 1)])

    def many() -> None:
        with sim.plane.db.read() as s:
            jobs_by_ids(s, jobs + missing)
            att.by_keys(s, [(j, 1) for j in jobs + missing])

    few, lots = _sent(sim, one), _sent(sim, many)
    if sim.plane.db.is_sqlite:
        assert few != lots  # an IN list of one and of 84 keys
    else:
        assert few == lots and all("ANY" in text for text in few)


def test_a_key_longer_than_the_column_finds_nothing(sim: Sim) -> None:
    """A key is compared as given on both databases: cast to the column's length on
    PostgreSQL, a longer key would be cut down to one that matches."""
    job = submit(sim, spec().name("long").flavors("a100-80g").replicas(1).topology(None), 60)
    with sim.plane.db.read() as s:
        assert jobs_by_ids(s, [job + "EXTRA"]) == {}
        assert att.by_keys(s, [(job + "EXTRA", 1)]) == []
        assert set(jobs_by_ids(s, [job])) == {job}


def test_none_of_excludes_its_keys_and_postgresql_hashes_them(sim: Sim) -> None:
    """`none_of`: the rows but those keys (an empty list excludes nothing). On PostgreSQL the
    keys are one hashed set: `<> ALL (array)` compared each row with every key, which made
    the fair-share read of the 100/s soak (12,000 keys, as many rows) cost the server 89 ms a
    cycle."""
    from broker.store.in_lists import none_of
    from broker.store.tables import JOBS

    jobs = [submit(sim, spec().name(f"n{i}").flavors("a100-80g").replicas(1).topology(None),
                   600) for i in range(3)]
    stmt = sa.select(JOBS.c.id).where(none_of(JOBS.c.id, "ids"))
    with sim.plane.db.read() as s:
        conn = s.connection()
        assert {r[0] for r in conn.execute(stmt, {"ids": jobs[:2] + ["x"] * 50})} == {jobs[2]}
        assert {r[0] for r in conn.execute(stmt, {"ids": []})} == set(jobs)
        numbers = sa.select(JOBS.c.id).where(none_of(JOBS.c.number, "numbers"))  # integers
        first = conn.execute(sa.select(JOBS.c.number).where(JOBS.c.id == jobs[0])).scalar()
        assert {r[0] for r in conn.execute(numbers, {"numbers": [first]})} == set(jobs[1:])
        if conn.dialect.name == "postgresql":
            for checked, params in ((stmt, {"ids": jobs}), (numbers, {"numbers": [first]})):
                plan = "\n".join(r[0] for r in conn.exec_driver_sql(
                    "EXPLAIN " + str(checked.compile(conn)), params))
                assert "hashed SubPlan" in plan or "Hash Anti Join" in plan, plan
