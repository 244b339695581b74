"""Kill -9 after every commit that changes a job's state, in turn, on the real Slurm cluster:
a job that fails once and is retried, a job that is preempted once, and the job that preempts
it must end as they end without a kill (issue 27: "no crash window").

One lifecycle, many processes: every server is started armed to SIGKILL itself right after its
first transaction that appended a job event (`ISTHMUS_CRASH_AT=after-state-commit`,
broker.control.faults), whoever commits it: the API's submit, an admission, a dispatch, a
reconcile pass, a preemption, a retry, the leader's repair. The next server recovers from the
database and Slurm's own facts, makes one more state change and dies in turn; so each commit
point of the three jobs' lifecycles is followed by a kill before anything else runs. Slurm
keeps running the jobs meanwhile (a real backend, unlike the in-process simulator).

`flaky` loses its node (its slurmd killed: Slurm ends it NODE_FAIL, an infrastructure
failure), is retried away from that node and succeeds; `low` fills the H100 partition until
`urgent` (priority high) preempts it, and runs again after.

Before the retry decision moved into the transaction that records the failure, the kill right
after `flaky`'s FAILED commit left it FAILED for ever (the old requeue ran in a transaction of
its own after that commit): this test failed there.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from broker import ledger
from broker.orchestration.replay import check_all
from broker.store import attempts as att
from broker.store import open_database
from broker.store.queries import get_job, job_events
from tests.harness.server import Server, job_spec, slurm_backend, slurm_pools, write_config
from tests.harness.wait import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
T = TypeVar("T")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}


class KillAfterEveryCommit:
    """A server that dies after its first state-changing commit, started again as often as
    it dies, until the scenario is over; counts the kills."""

    def __init__(self, cfg: Path, db_url: str, logs: Path) -> None:
        self.cfg, self.db_url, self.logs = cfg, db_url, logs
        self.server: Server | None = None
        self.starts = 0
        self.kills = 0

    def up(self) -> Server:
        """The live server, or a new one if it died (as often as new ones die at once)."""
        while True:
            s = self.server
            if s is not None and s.alive() and s.started_or_died(timeout=120):
                return s  # answers its health check
            if s is not None and s.proc is not None and s.proc.returncode == -signal.SIGKILL:
                self.kills += 1
            self.starts += 1
            assert self.starts < 400, "the scenario does not converge"
            self.server = Server(self.cfg, self.db_url, self.logs / f"run{self.starts}.log",
                                 env={"ISTHMUS_CRASH_AT": "after-state-commit"})
            self.server.start(wait=False)

    def call(self, fn: Callable[[Server], T]) -> T:
        """`fn` against a live server, again on a new one when the server dies under it."""
        while True:
            server = self.up()
            try:
                return fn(server)
            except (httpx.HTTPError, AssertionError):
                def gone(s: Server = server) -> bool:
                    return not s.alive()

                try:  # a server killed under a request: its process ends a moment later
                    wait_until(gone, 10, "the server to exit", interval=0.05)
                except AssertionError:
                    raise AssertionError("the server failed a request and lives on") from None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def _flaky_command(marker: Path) -> list[str]:
    """Runs until its node is taken down the first time (the test kills that node's slurmd:
    NODE_FAIL, an infrastructure failure the default policy retries away from that node);
    ends at once after."""
    return ["sh", "-c", f"if [ -e {marker} ]; then sleep 1; else touch {marker}; sleep 300; fi"]


def _until_preempted() -> list[str]:
    """Attempt 1 runs long enough to be preempted (without a preemption the job would end after
    300 s with one attempt, which the test refuses); later attempts end at once."""
    return ["sh", "-c", 'if [ "$ISTHMUS_ATTEMPT" = 1 ]; then sleep 300; else sleep 1; fi']


def _node_of(slurm: object, job_id: str) -> str | None:
    out = slurm.run(  # type: ignore[attr-defined]
        ["squeue", "-h", "-t", "R", "-n", f"isthmus-{job_id}-1", "-o", "%N"]).stdout.strip()
    return out or None


def _submit(server: Server, spec: dict[str, object], key: str) -> str:
    return str(server.submit(spec, key=key)["id"])


def _state(chain: KillAfterEveryCommit, job_id: str) -> str:
    return str(chain.call(lambda s: s.job(job_id))["state"])


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgres",
                                                             marks=pytest.mark.postgres)])
def test_kill_after_every_commit_changes_no_outcome(
        database: str, request: pytest.FixtureRequest, slurm_cluster: object,
        tmp_path: Path, workdir: Path) -> None:
    if database == "postgres":
        pg = request.getfixturevalue("pg_server")
        db_url = pg.url(pg.new_database(request.getfixturevalue("pg_template")))
    else:
        db_url = f"sqlite:///{tmp_path / 'isthmus.db'}"
    since = subprocess.run(["date", "+%Y-%m-%dT%H:%M:%S"], capture_output=True, text=True,
                           check=True).stdout.strip()
    cfg = write_config(
        tmp_path / "isthmus.yaml", [slurm_backend(slurm_cluster, workdir)], slurm_pools(),
        control={"preemption_min_runtime": 2, "preemption_protect_near_end": 0},
    )
    flaky = job_spec("flaky", "a100-80g", command=_flaky_command(workdir / "flaky.tried"),
                     backend="slurm")
    # low's first attempt runs until urgent preempts it (however long the kills and restarts
    # take on a busy machine: a fixed run could end first), its next one ends at once
    low = {**job_spec("low", "h100-80g", replicas=3, command=_until_preempted(), backend="slurm"),
           "priority": "low"}
    high = {**job_spec("urgent", "h100-80g", command=["sleep", "3"], backend="slurm"),
            "priority": "high"}
    chain = KillAfterEveryCommit(cfg, db_url, tmp_path)
    try:
        ids: dict[str, str] = {}
        for name, spec in (("flaky", flaky), ("low", low)):
            ids[name] = chain.call(partial(_submit, spec=spec, key=name))

        def flaky_node() -> str | None:
            chain.up()  # the scenario goes on only while a server runs
            tried = (workdir / "flaky.tried").exists()
            return _node_of(slurm_cluster, ids["flaky"]) if tried else None

        node = wait_until(flaky_node, 300, "flaky running")
        slurm_cluster.kill_node(node)  # type: ignore[attr-defined]
        wait_until(lambda: _state(chain, ids["low"]) == "RUNNING", 300, "low running",
                   interval=0.5)
        ids["urgent"] = chain.call(partial(_submit, spec=high, key="urgent"))
        wait_until(lambda: all(_state(chain, i) in TERMINAL for i in ids.values()), 600,
                   "every job ended", interval=0.5)
    finally:
        chain.stop()
        slurm_cluster.restore_nodes()  # type: ignore[attr-defined]
    # about 15 commit points change these jobs' states (a commit may change several jobs)
    assert chain.kills >= 8, f"only {chain.kills} kills in {chain.starts} starts"

    db = open_database(db_url, migrate=False)
    try:
        with db.read() as s:
            assert list(check_all(s)) == []  # every job's events replay to its row
            assert ledger.check(s) == []
            assert sum(g for g, _ in ledger.usage(s).values()) == 0  # no quota left held
            ends = {}
            story = {}  # each job's events, for the message of a failed assertion
            for name, job_id in ids.items():
                job = get_job(s, job_id)
                assert job is not None
                attempts = att.attempts_of(s, job_id)
                ends[name] = (job.state, len(attempts), sum(a.preempted for a in attempts))
                story[name] = [(e.to_state, e.reason, e.actor, e.message[:80])
                               for e in job_events(s, job_id)]
                assert all(a.ended_at is not None for a in attempts), (name, attempts)
                assert all(a.retry_decision is not None for a in attempts
                           if a.failure is not None or a.preempted), (name, attempts)
    finally:
        db.dispose()
    # without kills: flaky 2 attempts (one failure), low 2 (one preemption), urgent 1
    assert ends["flaky"][0] == "SUCCEEDED" and ends["flaky"][1] in (2, 3), (ends, story)
    assert ends["low"][0] == "SUCCEEDED" and ends["low"][1] in (2, 3), (ends, story)
    assert ends["low"][2] >= 1, (ends, story)
    assert ends["urgent"][0] == "SUCCEEDED" and ends["urgent"][1] in (1, 2), (ends, story)
    out = slurm_cluster.run(  # type: ignore[attr-defined]
        ["sacct", "-X", "-n", "-P", "-a", "-S", since, "-o", "JobName"]).stdout
    names = [n for n in out.split() if n.startswith("isthmus-")]
    assert len(names) == len(set(names)), "a backend object was made twice"
