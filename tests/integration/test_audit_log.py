"""The audit log (issue 33): every state-changing call and every admin read of another team's
data is recorded with actor, time, action, target, outcome and request id; the records form
one hash chain whatever the number of writers, the database refuses to change or delete
them, and `isthmus db check` names the first row changed behind its back."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import broker.cli.common as common
import broker.cli.main as cli
from broker.api import audit_trail
from broker.api.app import ROUTERS, create_app
from broker.api.audit_linker import AuditLinker
from broker.config import IsthmusConfig, parse_config
from broker.store import Database, audit_log
from broker.store.tables import AUDIT_STAGED
from broker.ui.session import COOKIE
from broker.web import build_app
from tests.builders import spec
from tests.fixtures.postgres import POSTGRES_ONLY
from tests.harness.audit import intact, lines, records
from tests.harness.inprocess import route_clients
from tests.harness.sim import CONFIG
from tests.harness.statements import statements_sent

ENTRY = audit_log.Entry(
    actor="ada", actor_team=None, actor_admin=True, action="pool.drain", method="POST",
    route="/v1/admin/pools/{pool}/drain", target="pool:slurm-h100", outcome="allowed",
    status=200, request_id="r0")


def _entries(n: int, tag: str) -> list[audit_log.Entry]:
    return [dataclasses.replace(ENTRY, request_id=f"{tag}{i}") for i in range(n)]


def _stage(db: Database, n: int, tag: str = "r") -> None:
    """`n` records written as calls write theirs, not linked."""
    with db.write() as s:
        audit_log.stage(s, _entries(n, tag))


def _append(db: Database, n: int, tag: str = "r") -> list[int]:
    """`n` records staged and linked; their numbers."""
    _stage(db, n, tag)
    audit_log.link_staged(db)
    return [r.seq for r in records(db) if r.request_id.startswith(tag)][-n:]


def _staged(db: Database) -> int:
    with db.read() as s:
        return audit_log.staged_count(s)


def _raw(db: Database, *statements: str) -> None:
    with db.writer.begin() as conn:
        for sql in statements:
            conn.exec_driver_sql(sql)


def _untriggered(db: Database) -> None:
    """What a tamperer with the rights to change the schema does first."""
    if db.is_sqlite:
        _raw(db, "DROP TRIGGER audit_log_no_update", "DROP TRIGGER audit_log_no_delete")
    else:
        _raw(db, "DROP TRIGGER audit_log_append_only ON audit_log")


def _verify(db: Database) -> audit_log.Verified:
    with db.read() as s:
        return audit_log.verify(s)


def test_rows_form_one_chain_and_a_changed_row_is_named(db: Database) -> None:
    assert _append(db, 3) == [1, 2, 3] and _append(db, 2, "s") == [4, 5]
    rows = records(db)
    assert rows[0].prev_hash == audit_log.GENESIS
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(rows))
    assert _verify(db) == audit_log.Verified(5, None)
    _untriggered(db)
    _raw(db, "UPDATE audit_log SET actor = 'mallory' WHERE seq = 3")
    broken = _verify(db).broken
    assert broken is not None and broken.seq == 3 and "content" in broken.problem


def test_a_row_rewritten_with_a_fresh_hash_or_removed_is_named(db: Database) -> None:
    _append(db, 5)
    _untriggered(db)
    second = dataclasses.asdict(records(db)[1]) | {"status": 500}
    fresh = audit_log.row_hash(second["prev_hash"], second)
    _raw(db, f"UPDATE audit_log SET status = 500, hash = '{fresh}' WHERE seq = 2")
    broken = _verify(db).broken
    assert broken is not None and broken.seq == 2 and "fresh hash" in broken.problem
    _raw(db, "DELETE FROM audit_log WHERE seq IN (1, 2)")
    broken = _verify(db).broken
    assert broken is not None and broken.seq == 3 and "1..2 are missing" in broken.problem


def test_the_database_refuses_to_change_or_delete_a_record(db: Database) -> None:
    _append(db, 2)
    for sql in ("UPDATE audit_log SET actor = 'mallory'", "DELETE FROM audit_log"):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"):
            _raw(db, sql)
    assert [r.actor for r in records(db)] == ["ada", "ada"] and intact(db)


def test_concurrent_writers_keep_one_linear_chain(db: Database) -> None:
    """API workers and replicas stage and link at once: the chain's lock (an advisory lock
    on PostgreSQL, the write lock on SQLite) keeps every link on the tail it read, and each
    staged record is linked once."""
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def writer(w: int) -> None:
        try:
            start.wait()
            for i in range(20):
                _stage(db, 1 + i % 3, f"w{w}-{i}-")
                audit_log.link_staged(db)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    expected = 6 * sum(1 + i % 3 for i in range(20))
    assert _staged(db) == 0
    assert _verify(db) == audit_log.Verified(expected, None)
    rows = records(db)
    assert [r.seq for r in rows] == list(range(1, expected + 1))
    assert len({r.request_id for r in rows}) == expected


def test_a_call_stages_its_record_in_one_statement_without_the_chains_lock(
        db: Database) -> None:
    """A call's transaction inserts its records and nothing else: no tail read, no lock that
    the calls of other replicas wait for (the chain's lock was held by every audited call
    through its commit)."""
    with statements_sent(db.writer) as sent, db.write() as s:
        audit_log.stage(s, _entries(3, "x"))
    verbs = [text.split()[0] for text, _ in sent if not text.startswith("BEGIN")]
    assert verbs == ["INSERT"] and not any("advisory" in text for text, _ in sent)
    assert _staged(db) == 3 and _verify(db) == audit_log.Verified(0, None)


def test_linking_moves_staged_records_to_the_chains_end_in_order(db: Database) -> None:
    """The tail is read after the lock's own statement on PostgreSQL, so that its snapshot
    sees the last linker's tail; the records keep the time they were staged at."""
    _append(db, 2)
    _stage(db, 3, "x")
    with db.read() as s:
        staged_at = [r.at for r in s.connection().execute(
            sa.select(AUDIT_STAGED).order_by(AUDIT_STAGED.c.id))]
    with statements_sent(db.writer) as sent:
        assert audit_log.link_staged(db) == 3
    verbs = [text.split()[0] for text, _ in sent if not text.startswith("BEGIN")]
    locked = [] if db.is_sqlite else ["SELECT"]
    # anything staged? (no lock taken when not), the lock, the tail, the staged, the move
    assert verbs == ["SELECT", *locked, "SELECT", "SELECT", "INSERT", "DELETE"]
    if not db.is_sqlite:
        assert "pg_advisory_xact_lock" in sent[1][0]
    linked = [r for r in records(db) if r.request_id.startswith("x")]
    assert [r.seq for r in linked] == [3, 4, 5] and [r.request_id for r in linked] == [
        "x0", "x1", "x2"]
    assert [r.at for r in linked] == staged_at and linked[0].at.tzinfo is not None
    assert _staged(db) == 0 and _verify(db) == audit_log.Verified(5, None)


def test_a_staged_record_cannot_be_changed(db: Database) -> None:
    _stage(db, 1)
    with pytest.raises(sa.exc.DBAPIError, match="UPDATE refused"):
        _raw(db, "UPDATE audit_staged SET actor = 'mallory'")
    assert [r.actor for r in records(db)] == ["ada"] and intact(db)


def test_records_a_process_left_staged_are_linked_by_any_linker(db: Database) -> None:
    """A process that died between its commit and its linking left its records staged: the
    pass each process runs as it starts (here two of them, racing) links each of them once,
    and so does any later pass, which links whatever is staged."""
    _stage(db, 4, "dead")
    linkers = [AuditLinker(db) for _ in range(2)]
    for linker in linkers:
        linker.start()
    deadline = time.monotonic() + 30
    while _staged(db) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _staged(db) == 0  # linked by the starting passes, not by a reader
    _stage(db, 1, "late")
    linkers[0].poke()
    while _staged(db) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _staged(db) == 0
    for linker in linkers:
        linker.close()
    assert [r.request_id for r in records(db)] == ["dead0", "dead1", "dead2", "dead3", "late0"]
    assert _verify(db) == audit_log.Verified(5, None)


def test_db_check_fails_naming_the_tampered_row(db: Database, db_url: str) -> None:
    _append(db, 4)
    _stage(db, 2, "later")
    ok = CliRunner().invoke(cli.app, ["db", "check", "--db", db_url])
    assert ok.exit_code == 0, ok.output
    assert "audit log 4 rows, chain intact (2 records staged, to be linked)" in ok.output
    _untriggered(db)
    _raw(db, "UPDATE audit_log SET target = 'pool:k8s-a100' WHERE seq = 2")
    bad = CliRunner().invoke(cli.app, ["db", "check", "--db", db_url])
    assert bad.exit_code == 1, bad.output
    assert "audit row 2: its content does not match its hash" in bad.output
    as_json = CliRunner().invoke(cli.app, ["db", "check", "--db", db_url, "--json"])
    assert json.loads(as_json.output)["audit"]["broken"]["seq"] == 2
    assert json.loads(as_json.output)["audit"]["staged"] == 2


def _token(name: str, team: str | None, role: str) -> dict[str, object]:
    return {"name": name, "team": team, "role": role,
            "token_sha256": hashlib.sha256(name.encode()).hexdigest()}


def _config() -> IsthmusConfig:
    raw = copy.deepcopy(CONFIG)
    raw["auth"] = {"mode": "token", "tokens": [
        _token("ada", None, "admin"), _token("bob", "vision", "user"),
        _token("cyd", "language", "user")]}
    return parse_config(raw)


def _as(name: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {name}", **headers}


def _job(client: TestClient, team: str, who: str, name: str = "j") -> str:
    body = spec().team(team).name(name).flavors("h100-80g").replicas(1).gpus(8).topology(None)
    r = client.post("/v1/jobs", json=body.build().model_dump(mode="json"), headers=_as(who))
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_every_state_changing_route_has_an_action() -> None:
    from broker.ui import (
        pages,
        pages_approvals,
        pages_audit,
        pages_decisions,
        pages_fleet,
        pages_jobs,
        pages_submit,
    )

    ui = [m.router for m in (pages, pages_approvals, pages_audit, pages_decisions, pages_fleet,
                             pages_jobs, pages_submit)]
    routes = {f"{r.endpoint.__module__.rsplit('.', 1)[-1]}.{r.endpoint.__name__}": r
              for router in (*ROUTERS, *ui) for r in router.routes if isinstance(r, APIRoute)}
    changing = {k for k, r in routes.items() if set(r.methods or ()) - {"GET", "HEAD"}}
    assert changing - set(audit_trail.ACTIONS) - set(audit_trail.NOT_RECORDED) == set()
    assert set(audit_trail.ACTIONS) <= changing  # no action names a route that is gone


def test_calls_are_recorded_with_actor_target_outcome_and_request_id(db: Database) -> None:
    client = TestClient(create_app(_config(), db))
    body = spec().team("vision").name("mine").flavors("h100-80g").replicas(1).gpus(8)
    r = client.post("/v1/jobs", json=body.topology(None).build().model_dump(mode="json"),
                    headers=_as("bob", **{"X-Request-ID": "req-42"}))
    assert r.status_code == 201 and r.headers["X-Request-ID"] == "req-42"
    mine = r.json()["id"]
    theirs = _job(client, "language", "cyd")
    generated = client.get("/healthz").headers["X-Request-ID"]
    assert len(generated) == 32  # one of ours when the client sends none
    assert client.get(f"/v1/jobs/{mine}", headers=_as("bob")).status_code == 200  # own team
    assert client.post(f"/v1/jobs/{theirs}/cancel", headers=_as("bob")).status_code == 404
    assert client.post(f"/v1/jobs/{theirs}/cancel").status_code == 401
    assert client.post("/v1/admin/pools/slurm-h100/drain", json={},
                       headers=_as("bob")).status_code == 403
    assert client.post("/v1/plan", json=body.build().model_dump(mode="json"),
                       headers=_as("bob")).status_code == 200  # stores nothing
    assert client.get(f"/v1/jobs/{theirs}", headers=_as("ada")).status_code == 200
    assert client.get("/v1/jobs", headers=_as("ada")).status_code == 200
    assert client.get("/v1/jobs", params={"team": "vision"},
                      headers=_as("ada")).status_code == 200
    assert client.post(f"/v1/jobs/{mine}/cancel", headers=_as("ada")).status_code == 200
    assert client.post("/v1/jobs", json={"name": "x"}, headers=_as("bob")).status_code == 422

    assert lines(db) == [
        ("job.submit", f"job:{mine}", "bob", 201),
        ("job.submit", f"job:{theirs}", "cyd", 201),
        ("job.cancel", f"job:{theirs}", "bob", 404),
        ("job.cancel", f"job:{theirs}", audit_trail.UNAUTHENTICATED, 401),
        ("pool.drain", "pool:slurm-h100", "bob", 403),
        ("read", f"job:{theirs}", "ada", 200),
        ("read", "all-teams", "ada", 200),
        ("read", "team:vision", "ada", 200),
        ("job.cancel", f"job:{mine}", "ada", 200),
        ("job.submit", "-", "bob", 422),
    ]
    first, *_, last = records(db)
    assert (first.request_id, first.outcome, first.actor_team, first.actor_admin,
            first.route) == ("req-42", "allowed", "vision", False, "/v1/jobs")
    assert last.outcome == "refused" and last.method == "POST"
    assert records(db)[-2].actor_admin is True and intact(db)


def test_a_submit_is_recorded_in_its_own_commit(db: Database,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot path writes its record in the submit's group commit: the audit writer's own
    transaction is not used for it."""
    written: list[str] = []
    real = audit_trail.AuditWriter._write

    def spy(self: audit_trail.AuditWriter, entries: list[audit_log.Entry]) -> None:
        written.extend(e.action for e in entries)
        real(self, entries)

    monkeypatch.setattr(audit_trail.AuditWriter, "_write", spy)
    client = TestClient(create_app(_config(), db))
    job = _job(client, "vision", "bob")
    assert client.post(f"/v1/jobs/{job}/cancel", headers=_as("bob")).status_code == 200
    assert lines(db) == [("job.submit", f"job:{job}", "bob", 201),
                         ("job.cancel", f"job:{job}", "bob", 200)]
    assert written == ["job.cancel"]


@POSTGRES_ONLY
def test_calls_are_answered_while_the_chain_is_locked_and_linked_after(db: Database) -> None:
    """Every audited call of every replica took the chain's lock and held it through its
    commit, so they waited in one line (in the 100/s soak: 5 ms a submit on average, 15-19
    ms the median record of a read). With another connection holding the lock, a submit and
    a cancel are answered now, their records staged; once the lock is released, the
    process's linker links them."""
    client = TestClient(create_app(_config(), db))
    with db.writer.connect() as holder:
        holder.exec_driver_sql(f"SELECT pg_advisory_xact_lock({audit_log._PG_AUDIT_LOCK})")
        answered: list[int] = []

        def calls() -> None:
            job = _job(client, "vision", "bob")
            answered.append(201)
            r = client.post(f"/v1/jobs/{job}/cancel", headers=_as("bob"))
            answered.append(r.status_code)

        caller = threading.Thread(target=calls, daemon=True)
        caller.start()
        caller.join(timeout=30)
        assert answered == [201, 200]  # answered while the lock was held
        assert _staged(db) == 2
        holder.rollback()  # the lock released
    deadline = time.monotonic() + 30
    while _staged(db) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _staged(db) == 0  # linked by the app's linker, not by a reader
    assert [(a, u, st) for a, _, u, st in lines(db)] == [("job.submit", "bob", 201),
                                                          ("job.cancel", "bob", 200)]


def test_a_failed_linking_pass_is_tried_again(db: Database,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The database unreachable for the process's pass: the records stay staged and the
    linker tries again by itself (no new call pokes it), until a pass succeeds."""
    real = audit_log.link_staged
    failures: list[int] = []

    def flaky(database: Database) -> int:
        if not failures:
            failures.append(1)
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("server closed"))
        return real(database)

    monkeypatch.setattr(audit_log, "link_staged", flaky)
    _stage(db, 2, "blip")
    linker = AuditLinker(db, gather_s=0.0, retry_s=0.05)
    linker.poke()
    deadline = time.monotonic() + 10
    while _staged(db) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert failures == [1] and _staged(db) == 0  # before close, which links what is left
    linker.close()
    assert [r.request_id for r in records(db)] == ["blip0", "blip1"]


def test_a_read_of_the_log_links_first_and_still_answers_if_it_cannot(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log's readers link what is staged (the records of calls just answered are
    listed); when linking fails, the read answers with what is linked."""
    client = TestClient(create_app(_config(), db))
    client.post("/v1/admin/pools/slurm-h100/drain", json={"reason": "x"}, headers=_as("ada"))
    _stage(db, 1, "just-answered")
    page = client.get("/v1/admin/audit", headers=_as("ada")).json()
    assert "just-answered0" in [i["request_id"] for i in page["items"]]

    def down(database: Database) -> int:
        raise sa.exc.OperationalError("SELECT 1", {}, Exception("server closed"))

    monkeypatch.setattr(audit_log, "link_staged", down)
    _stage(db, 1, "later")
    r = client.get("/v1/admin/audit", headers=_as("ada"))
    assert r.status_code == 200, r.text
    assert "later0" not in [i["request_id"] for i in r.json()["items"]]


def test_the_log_is_listed_filtered_paged_and_exported_to_admins_only(db: Database) -> None:
    client = TestClient(create_app(_config(), db))
    jobs = [_job(client, "vision", "bob", f"j{i}") for i in range(3)]
    client.post("/v1/admin/pools/slurm-h100/drain", json={"reason": "x"}, headers=_as("ada"))
    admin = _as("ada")
    page = client.get("/v1/admin/audit", params={"limit": 2}, headers=admin).json()
    assert [i["action"] for i in page["items"]] == ["pool.drain", "job.submit"]
    assert page["items"][1]["target"] == f"job:{jobs[2]}"
    older = client.get("/v1/admin/audit", params={"limit": 2, "cursor": page["next_cursor"]},
                       headers=admin).json()
    assert [i["target"] for i in older["items"]] == [f"job:{jobs[1]}", f"job:{jobs[0]}"]
    by_bob = client.get("/v1/admin/audit", params={"actor": "bob", "action": "job.submit"},
                        headers=admin).json()["items"]
    assert len(by_bob) == 3
    one = client.get("/v1/admin/audit", params={"target": f"job:{jobs[1]}"},
                     headers=admin).json()["items"]
    assert [(i["action"], i["status"]) for i in one] == [("job.submit", 201)]
    assert client.get("/v1/admin/audit", params={"since": "2999-01-01"},
                      headers=admin).json()["items"] == []
    assert client.get("/v1/admin/audit", params={"since": "2020-01-01T00:00:00",
                                                 "until": "2019-01-01"},
                      headers=admin).status_code == 422
    assert client.get("/v1/admin/audit", params={"cursor": "x"},
                      headers=admin).status_code == 422
    for params, accept in (({"format": "jsonl"}, {}), ({}, {"Accept": "application/x-ndjson"})):
        r = client.get("/v1/admin/audit", params=params, headers={**admin, **accept})
        assert r.headers["content-type"].startswith("application/jsonl")
        exported = [json.loads(line) for line in r.text.splitlines()]
        assert [e["seq"] for e in exported] == list(range(1, len(exported) + 1))
        assert exported[0]["prev_hash"] == audit_log.GENESIS
    assert client.get("/v1/admin/audit", headers=_as("bob")).status_code == 403
    assert client.delete("/v1/admin/audit", headers=admin).status_code == 405
    denied = records(db)[-1]  # a refused read is on the record; no route deletes
    assert (denied.actor, denied.action, denied.status) == ("bob", "read", 403)
    assert intact(db)


def test_the_dashboard_shows_the_log_to_admins(db: Database) -> None:
    app = build_app(_config(), db)
    job = _job(TestClient(app), "vision", "bob")
    admin = TestClient(app, cookies={COOKIE: "ada"}).get("/ui/audit")
    assert admin.status_code == 200 and 'id="audit"' in admin.text
    assert f'href="/ui/jobs/{job}"' in admin.text and "job.submit" in admin.text
    user = TestClient(app, cookies={COOKIE: "bob"}).get("/ui/audit")
    assert user.status_code == 403 and 'id="audit-admin-only"' in user.text
    assert job not in user.text
    assert lines(db)[-1] == ("read", "all-teams", "ada", 200)  # the admin's look is recorded


def test_isthmus_admin_audit(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(_config(), db)
    route_clients(monkeypatch, common, app)
    job = _job(TestClient(app), "vision", "bob")

    def run(*args: str) -> Any:
        out = CliRunner().invoke(cli.app, ["admin", "audit", "--token", "ada", *args])
        assert out.exit_code == 0, out.output
        return out.output

    table = run("--action", "job.submit")
    assert "job.submit" in table and f"job:{job}" in table and "allowed 201" in table
    assert json.loads(run("--json", "--actor", "bob"))["items"][0]["target"] == f"job:{job}"
    exported = [json.loads(line) for line in run("--jsonl").splitlines()]
    assert exported[0]["action"] == "job.submit" and exported[0]["seq"] == 1
    denied = CliRunner().invoke(cli.app, ["admin", "audit", "--token", "bob"])
    assert denied.exit_code == 1 and "admin" in denied.output


def test_a_record_that_cannot_be_written_is_counted_and_the_call_answered(
        db: Database) -> None:
    """The log fails open (README): the call is done and answered, the failure counted."""
    from broker.metrics import AUDIT_FAILED

    if db.dialect == "sqlite":
        _raw(db, "CREATE TRIGGER audit_broken BEFORE INSERT ON audit_staged "
                 "BEGIN SELECT RAISE(ABORT, 'broken'); END")
    else:
        _raw(db, "CREATE FUNCTION audit_broken() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$ BEGIN RAISE EXCEPTION 'broken'; END $$")
        _raw(db, "CREATE TRIGGER audit_broken BEFORE INSERT ON audit_staged "
                 "FOR EACH ROW EXECUTE FUNCTION audit_broken()")
    client = TestClient(create_app(_config(), db))
    before = AUDIT_FAILED._value.get()
    r = client.post("/v1/admin/pools/slurm-h100/drain", json={}, headers=_as("ada"))
    assert r.status_code == 200, r.text
    assert AUDIT_FAILED._value.get() == before + 1
    assert records(db) == []
