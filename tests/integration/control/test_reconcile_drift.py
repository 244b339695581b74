"""One team's broken quota counter does not hold back another team's job in the same
reconcile chunk: the counters are written at the chunk's commit, outside every attempt's
savepoint, so a counter whose CHECK fails there failed the whole chunk, on every pass."""

import sqlalchemy as sa

from tests.builders import spec
from tests.harness.sim import Sim, cycle, run_until, state, submit


def test_a_drifted_counter_fails_its_own_job_not_the_chunk(sim: Sim) -> None:
    jobs = {t: submit(sim, spec().name(f"j-{t}").team(t).flavors("h100-80g").replicas(1)
                      .topology(None), 300) for t in ("vision", "language")}
    for j in jobs.values():
        run_until(sim, j, "RUNNING", step=20)
    with sim.plane.db.write() as s:  # vision's counter drifted below what it holds
        s.connection().execute(sa.text(
            "update quota_usage set reserved_gpus = 0 where team = 'vision'"))

    cycle(sim, 900)  # both ended in the backend: one reconcile chunk

    assert state(sim, jobs["language"])[0] == "SUCCEEDED"
    vision = state(sim, jobs["vision"])
    assert vision[0] == "RUNNING" and vision[1] == "InternalError", vision
