"""The Slurm backend against the real local cluster, once per transport (CLI and slurmrestd).

Every test names its jobs isthmus-<fresh id>-<n> and only looks at those, so unrelated jobs in
the queue do not disturb it; every test cancels its own jobs at the end.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from backends.slurm import SlurmBackend
from broker.domain.attempts import backend_object_name
from broker.domain.facts import Fact, Phase
from broker.domain.failures import FailureCategory
from broker.domain.ids import new_job_id
from broker.domain.reasons import Reason
from tests.fixtures.slurm import SlurmCluster
from tests.harness.slurm_backend import (
    ENV_PROBE,
    Jobs,
    fact_for,
    free_a100,
    make_backend,
    output_of,
    wait_fact,
)
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm

@pytest.fixture(params=["cli", "rest"])
def backend(request: pytest.FixtureRequest, slurm_cluster: SlurmCluster) -> Iterator[SlurmBackend]:
    be = make_backend(slurm_cluster, request.param)
    yield be
    be.close()


@pytest.fixture
def jobs(slurm_cluster: SlurmCluster) -> Iterator[Jobs]:
    j = Jobs(slurm_cluster)
    yield j
    j.cleanup()


# -- inventory ------------------------------------------------------------------------------


def test_inventory_maps_partitions_to_pools(backend: SlurmBackend) -> None:
    inv = backend.inventory()
    pools = {p.name: p for p in inv.pools}
    assert set(pools) == {"slurm-a100", "slurm-h100"}
    for pool in pools.values():
        assert pool.selector in ("a100", "h100") and pool.total_gpus == 24
        assert {n.name for n in pool.nodes} == {f"{pool.selector}-{i}" for i in (1, 2, 3)}
        racks = {n.name: n.topology.rack for n in pool.nodes}
        assert racks[f"{pool.selector}-1"] == racks[f"{pool.selector}-2"] == "rack1"
        assert racks[f"{pool.selector}-3"] == "rack2"
        assert all(n.topology.block for n in pool.nodes)
        assert pool.queue.expected_wait_seconds is not None


# -- gang lifecycle -------------------------------------------------------------------------


def test_gang_runs_with_torchrun_environment(
    backend: SlurmBackend, jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    free_a100(slurm_cluster)
    req = jobs.request({"command": ["/usr/bin/python3", "-c", ENV_PROBE]})
    result = backend.submit(req)
    assert not result.adopted and result.backend_id.isdigit()
    fact = wait_fact(backend, req.name, {Phase.SUCCEEDED, Phase.FAILED}, timeout=60)
    assert fact.phase is Phase.SUCCEEDED, fact
    assert fact.reason is Reason.Succeeded and fact.exit_code == 0
    assert len(fact.nodes) == 2 and fact.job_id == req.job_id and fact.attempt == 1
    rows = [line.split("|")[1:] for line in output_of(backend, req.name, result.backend_id)
            .splitlines() if line.startswith("ENV|")]
    assert sorted(r[0] for r in rows) == ["0", "1"], rows
    first = fact.nodes[0]
    for rank, master, port, world, foo, node in rows:
        assert (master, port, world, foo) == (first, "29500", "2", "bar baz"), rows
    assert {r[5] for r in rows} == set(fact.nodes)


def test_second_gang_waits_with_resources_reason(
    backend: SlurmBackend, jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    free_a100(slurm_cluster)
    first = jobs.request({"command": ["sleep", "120"]})
    second = jobs.request({"command": ["sleep", "120"]})
    backend.submit(first)
    wait_fact(backend, first.name, {Phase.RUNNING}, timeout=30)
    backend.submit(second)

    def resources() -> Fact | None:
        fact = fact_for(backend, second.name)
        return fact if fact.raw_reason == "Resources" else None

    fact = wait_until(resources, timeout=30, interval=1, what="Resources reason")
    assert (fact.phase, fact.reason, fact.failure) == (Phase.PENDING, Reason.BackendPending, None)
    depth = backend.inventory().pool("slurm-a100")
    assert depth is not None and depth.queue.isthmus_pending_gpus >= 16
    assert depth.queue.isthmus_pending_jobs >= 1
    # the running gang's nodes say when their GPUs are due back: start + its 10 min limit
    running = fact_for(backend, first.name)
    assert running.started_at is not None and len(running.nodes) == 2
    releases = {n.name: n.releases for n in depth.nodes}
    for node in running.nodes:
        ((at, gpus),) = releases[node]
        assert gpus == 8
        assert timedelta(minutes=10) <= at - running.started_at <= timedelta(minutes=11), at
    for req in (first, second):
        assert backend.cancel(req.name, 0).found


def test_rack_constrained_gang_stays_in_one_rack(
    backend: SlurmBackend, jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    free_a100(slurm_cluster)
    req = jobs.request({"command": ["sleep", "60"]}, level="rack", domain="spine/rack1")
    script = backend.render(req)
    assert "#SBATCH --switches=1" in script and "#SBATCH --constraint=rack1" in script
    backend.submit(req)
    fact = wait_fact(backend, req.name, {Phase.RUNNING}, timeout=30)
    racks = {n.name: n.topology.rack for p in backend.inventory().pools for n in p.nodes}
    assert {racks[n] for n in fact.nodes} == {"rack1"}, fact.nodes
    backend.cancel(req.name, 0)


def test_failing_script_is_user_error_also_after_it_left_the_queue(
    backend: SlurmBackend, jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    failing = jobs.request({"script": "#!/bin/bash\necho failing\nexit 3"}, pool="slurm-h100",
                           replicas=1)
    passing = jobs.request({"command": ["true"]}, pool="slurm-h100", replicas=1)
    backend.submit(failing)
    backend.submit(passing)
    fact = wait_fact(backend, failing.name, {Phase.FAILED, Phase.SUCCEEDED}, timeout=60)
    assert (fact.phase, fact.failure, fact.exit_code) == (
        Phase.FAILED, FailureCategory.USER_ERROR, 3), fact
    assert "exit code 3" in fact.message
    # the evidence behind that: its ranks did start (a numbered step in accounting)
    steps = backend.transport.steps([fact.backend_id or ""])
    assert "0" in steps[fact.backend_id or ""], steps

    # MinJobAge=10 s: wait until both left the queue, then a fresh adapter (as after a
    # restart) must still classify them, from accounting alone
    def departed() -> bool:
        names = {r.name for r in backend.transport.jobs()}
        return failing.name not in names and passing.name not in names

    wait_until(departed, timeout=60, interval=2, what="jobs left squeue")
    fresh = make_backend(slurm_cluster, backend.transport.kind)
    facts = {f.backend_name: f for f in fresh.observe([failing.name, passing.name])}
    done = facts[passing.name]
    assert (done.phase, done.reason) == (Phase.SUCCEEDED, Reason.Succeeded), done
    gone = facts[failing.name]
    assert gone.phase is Phase.FAILED and gone.raw_state == "FAILED", gone
    if fresh.transport.dialect().db_exit_code_reliable or backend.transport.kind == "cli":
        assert (gone.failure, gone.exit_code) == (FailureCategory.USER_ERROR, 3), gone
    else:  # slurmdbd JSON on 22.05 loses exit codes: no evidence, so no guess
        assert (gone.failure, gone.exit_code) == (FailureCategory.UNKNOWN, None), gone
    # the adapter that saw the job in the queue keeps its exit code after the departure
    again = fact_for(backend, failing.name)
    assert (again.failure, again.exit_code) == (FailureCategory.USER_ERROR, 3), again
    lost = fresh.observe([backend_object_name(new_job_id(), 1)])
    assert lost[0].phase is Phase.LOST and lost[0].failure is FailureCategory.ORCHESTRATION


def test_batch_script_failing_before_srun_is_not_the_users_error(
    backend: SlurmBackend, slurm_cluster: SlurmCluster
) -> None:
    # what Isthmus's batch script does when srun cannot reach slurmctld, or when it fails
    # before launching the ranks: the batch shell exits non-zero and no rank step exists
    name = backend_object_name(new_job_id(), 1)
    job_id = slurm_cluster.run(["sbatch", "--parsable", "-J", name, "-p", "h100", "-N", "1",
                                "--output=/dev/null", "--wrap", "exit 1"]).stdout.strip()
    try:
        def ended() -> Fact | None:
            fact = fact_for(backend, name)
            recorded = backend.transport.steps([job_id])  # accounting has its end
            return fact if fact.phase is Phase.FAILED and recorded else None

        wait_until(ended, timeout=60, interval=1, what=f"{name} FAILED and in accounting")
        fact = fact_for(make_backend(slurm_cluster, backend.transport.kind), name)
        assert (fact.failure, fact.reason) == (FailureCategory.ORCHESTRATION,
                                               Reason.Orchestration), fact
        assert "before any rank started" in fact.message
    finally:
        slurm_cluster.run(["scancel", job_id], check=False)


def test_resubmit_after_crash_adopts_the_existing_job(
    backend: SlurmBackend, jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    req = jobs.request({"command": ["sleep", "30"]}, pool="slurm-h100", replicas=1)
    first = backend.submit(req)
    restarted = make_backend(slurm_cluster, backend.transport.kind)
    again = restarted.submit(req)
    assert again.adopted and again.backend_id == first.backend_id
    out = slurm_cluster.run(["squeue", "-h", "--name", req.name, "-o", "%i"]).stdout.split()
    assert out == [first.backend_id]
    looked = restarted.lookup(req.name)
    assert looked is not None and looked.backend_id == first.backend_id
    restarted.cancel(req.name, 0)
    wait_fact(restarted, req.name, {Phase.CANCELLED}, timeout=30)
    # after the job left the queue, a third try still adopts it (found through accounting)
    assert restarted.submit(req).adopted


def test_cancel_signals_first_then_kills_after_grace(
    backend: SlurmBackend, jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    trap = ("#!/bin/bash\ntrap 'echo checkpointing rank $NODE_RANK; sleep 30' USR1\n"
            "echo started; for i in $(seq 120); do sleep 1; done")
    req = jobs.request({"script": trap}, pool="slurm-h100", replicas=1, grace=60)
    job_id = backend.submit(req).backend_id
    wait_fact(backend, req.name, {Phase.RUNNING}, timeout=30)
    # the script says "started" once its trap is installed
    wait_until(lambda: "started" in output_of(backend, req.name, job_id), timeout=60,
               interval=0.5, what="the user's trap to be installed")
    result = backend.cancel(req.name, 3)
    assert result.found and result.signalled, result
    assert fact_for(backend, req.name).phase is Phase.RUNNING  # still checkpointing
    wait_until(lambda: "checkpointing rank 0" in output_of(backend, req.name, job_id),
               timeout=60, interval=0.5, what="USR1 reached the rank")
    # the kill comes after the 3 s grace: polled, as the trap's sleep 30 would outlast it
    fact = wait_fact(backend, req.name, {Phase.CANCELLED}, timeout=60)
    assert fact.reason is Reason.CancelledByUser and fact.actor is None, fact
    assert not backend.cancel(req.name, 3).found


def test_node_lost_mid_job_is_infra_transient(
    backend: SlurmBackend, jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    free_a100(slurm_cluster)
    req = jobs.request({"command": ["sleep", "300"]})
    backend.submit(req)
    fact = wait_fact(backend, req.name, {Phase.RUNNING}, timeout=30)
    lost = fact.nodes[-1]
    try:
        slurm_cluster.kill_node(lost)
        end = wait_fact(backend, req.name, {Phase.FAILED, Phase.CANCELLED}, timeout=90)
        assert (end.phase, end.failure) == (Phase.FAILED, FailureCategory.INFRA_TRANSIENT), end
        # Usually NODE_FAIL; sometimes srun on the batch host gives up on the lost rank first
        # and Slurm says FAILED with an exit code (seen: 105:0). The job stays COMPLETING until
        # the node is declared DOWN, so either way the node is down when the end is seen.
        assert end.raw_state in ("NODE_FAIL", "FAILED"), end
        assert re.search(r"node", end.message)
        # still down (no slurmd to answer) when the end is seen: named on both transports
        assert f"{lost} down+not_responding (Not responding" in end.message, end
    finally:
        jobs.cleanup()
        slurm_cluster.restore_nodes()


def test_node_set_down_mid_job_is_infra_naming_that_node(
    backend: SlurmBackend, jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    """An admin (or a health checker) sets a running gang's batch host DOWN. Slurm may end the
    job NODE_FAIL or FAILED with an exit code; either way it is the node's fault, and no
    healthy node is blamed. With ReturnToService=2 (this cluster) the node, whose slurmd still
    answers, is idle again within a second, long before anyone observes the end: only the
    node event in accounting (sacctmgr, CLI transport) still names it. slurmrestd serves no
    node events, so over REST the failure is infrastructure but its node stays unnamed.

    Every node of the partition also carries a fault event from just before the job, on every
    run (not only after another test that took a node down): the gang waits for its nodes and
    starts the moment they are back, in the very second their events end. Those events are not
    this job's and must not be blamed."""
    free_a100(slurm_cluster)
    partition = ",".join(n for n in slurm_cluster.nodes if n.startswith("a100-"))
    req = jobs.request({"command": ["sleep", "300"]})
    # held, so that slurmrestd takes it too (it refuses a job whose nodes are all down)
    backend.transport.submit(backend.batch_job(req, hold=True))
    held = wait_fact(backend, req.name, {Phase.PENDING}, timeout=60)
    try:
        slurm_cluster.run(["scontrol", "update", f"NodeName={partition}", "State=FAIL",
                           "Reason=isthmus-stale"])
        slurm_cluster.run(["scontrol", "release", held.backend_id or ""])

        def waiting_for_nodes() -> bool:  # the scheduler has looked at it since the release
            fact = fact_for(backend, req.name)
            return fact.phase is Phase.PENDING and fact.raw_reason not in ("JobHeldUser",
                                                                           "None", "")

        wait_until(waiting_for_nodes, timeout=60, interval=0.5,
                   what=f"{req.name} waiting for its nodes")
        # Resume just after a second begins: the gang then starts within that second (times
        # are whole seconds), the very second its nodes' events end, on every run.
        time.sleep(1.02 - time.time() % 1)
        slurm_cluster.run(["scontrol", "update", f"NodeName={partition}", "State=RESUME"])

        def running_on_all() -> Fact | None:  # RUNNING, not COMPLETING with fewer nodes
            fact = fact_for(backend, req.name)
            return fact if fact.raw_state == "RUNNING" and len(fact.nodes) == 2 else None

        running = wait_until(running_on_all, timeout=120, interval=1,
                             what=f"{req.name} running on 2 nodes")
        bad, *healthy = running.nodes  # the first node of the allocation runs the batch script
        slurm_cluster.run(["scontrol", "update", f"NodeName={bad}", "State=DOWN",
                           "Reason=isthmus-test"])
        # the verdict may wait for accounting to record the end and the node's event
        end = wait_fact(backend, req.name, {Phase.FAILED, Phase.SUCCEEDED, Phase.CANCELLED},
                        timeout=180)
        assert (end.phase, end.reason, end.failure) == (
            Phase.FAILED, Reason.InfraTransient, FailureCategory.INFRA_TRANSIENT), end
        assert end.raw_state in ("FAILED", "NODE_FAIL"), end
        if backend.transport.kind == "cli":
            # named from its event, or from its state if it is still down when the end is seen
            assert re.search(rf"{bad} down \(isthmus-test(; recorded [^)]*)?\)", end.message), end
            assert end.bad_nodes == (bad,), end
        assert not any(n in end.message for n in healthy), end
        assert "isthmus-stale" not in end.message, end
        assert end.nodes == running.nodes, end
    finally:
        jobs.cleanup()
        slurm_cluster.run(["scontrol", "update", f"NodeName={partition}", "State=RESUME"],
                          check=False)
        names = partition.split(",")
        wait_until(lambda: all(slurm_cluster.node_states().get(n) == "idle" for n in names),
                   timeout=120, interval=1, what=f"{partition} idle again")
