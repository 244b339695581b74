"""A large gang is never starved by a stream of small jobs: the real admission cycle drives a
simulated backend minute by minute (small jobs also wait in the backend's queue, which reports
their shapes), the gang waits behind the stream, its reservation holds a rack, and it starts."""

from __future__ import annotations

from datetime import UTC, datetime

from backends.base import SubmitRequest
from backends.sim import DURATION_ENV, SimBackend, SimClock, SimPoolSpec
from broker.domain.attempts import RunSnapshot
from broker.domain.spec import JobSpec
from broker.domain.topology import TopologyLevel
from policies.cycle import AdmissionParams, admission_cycle
from policies.ordering import OrderingParams
from policies.types import FlavorQuota, PendingJob, QuotaConfig, TeamQuota, Usage

T0 = datetime(2025, 1, 1, tzinfo=UTC)
LIMIT_S = 4 * 3600
QUOTAS = QuotaConfig(teams={t: TeamQuota(t, "all", {"h100": FlavorQuota(64)})
                            for t in ("vision", "language")})


def _request(job: PendingJob, decision_placement: object, run_s: float) -> SubmitRequest:
    spec = JobSpec.model_validate({
        "name": job.id, "team": job.team, "flavors": ["h100"], "max_runtime": LIMIT_S,
        "gang": {"replicas": job.replicas, "gpus_per_replica": job.gpus_per_replica},
        "entrypoint": {"image": "i", "command": ["run"]},
    })
    return SubmitRequest(job_id=job.id, attempt=1, name=f"isthmus-{job.id}-1",
                         snapshot=RunSnapshot.of(spec), placement=decision_placement,  # type: ignore[arg-type]
                         env={DURATION_ENV: str(run_s)})


def gang_start_minute(params: AdmissionParams, hours: int, excludes: bool = True
                      ) -> int | None:
    """Minutes from its submission until the 4 x 8 rack gang starts (None: not within
    `hours`), under one small job a minute (1, 2 or 4 GPUs, 20-60 min of work: ~1.3x the
    pool's 64 GPUs), on one pool of 2 racks x 4 nodes x 8 GPUs that queues up to 2 jobs;
    `excludes`: the pool honours a placement's excluded nodes."""
    clock = SimClock(T0)
    pool = SimPoolSpec("p1", "h100", blocks=1, racks_per_block=2, nodes_per_rack=4,
                       max_isthmus_pending=2, excludes_nodes=excludes)
    backend = SimBackend("sim-a", "slurm", [pool], clock, seed=1, events=True)
    run_s: dict[str, float] = {}
    pending: dict[str, PendingJob] = {}

    def add(jid: str, team: str, replicas: int, gpus: int, run: float, level: object) -> None:
        pending[jid] = PendingJob(id=jid, team=team, replicas=replicas, gpus_per_replica=gpus,
                                  flavors=("h100",), submitted_at=clock.now,
                                  max_runtime_s=LIMIT_S, topology_required=level)  # type: ignore[arg-type]
        run_s[jid] = run

    for minute in range(hours * 60):
        add(f"s{minute}", "language", 1, (1, 2, 4)[minute % 3], 1200 + 600 * (minute % 5), None)
        if minute == 30:  # the stream has filled the pool by now
            add("gang", "vision", 4, 8, 3600, TopologyLevel.RACK)
        res = admission_cycle(list(pending.values()), backend.inventory(), QUOTAS,
                              Usage(), clock.now, params)
        for d in res.admitted():
            backend.submit(_request(pending.pop(d.job_id), d.placement, run_s[d.job_id]))
        clock.advance(60)
        backend.sync()
        for name, kind in backend.drain_events():
            if name == "isthmus-gang-1" and kind == "start":
                return minute - 30
    return None


NEVER_CLOSED = 366 * 86400.0
GUARD_AFTER = 2 * 3600.0  # queue_closed_after_s: 24 h by default; 2 h keeps the test short


def test_a_large_gang_starts_when_queued_jobs_exclude_its_rack() -> None:
    # where the backend honours exclusions: once the gang has waited 2 h here, its hold stays
    # in one rack and jobs queued in the backend exclude that rack; the queue is never closed
    # in such a pool, and the rack drains (measured: it starts after 169 min; closing: 164)
    params = AdmissionParams(ordering=OrderingParams(queue_closed_after_s=GUARD_AFTER))
    waited = gang_start_minute(params, hours=10)
    bound = params.ordering.queue_closed_after_s / 60 + 90
    assert waited is not None and waited <= bound, waited


def test_without_exclusion_or_closing_the_stream_starves_it() -> None:
    # what the test above guards: the exclusion off and the queue never closed: the gang does
    # not start in 10 h
    off = AdmissionParams(ordering=OrderingParams(queue_exclude=False,
                                                  queue_closed_after_s=NEVER_CLOSED))
    assert gang_start_minute(off, hours=10) is None


def test_a_backend_that_cannot_exclude_falls_back_to_closing_the_queue() -> None:
    # it holds a rack after an hour; after queue_closed_after_s no new job is queued in the
    # backend, whose queue drains within the hour (measured: it starts after 164 min)
    params = AdmissionParams(ordering=OrderingParams(queue_closed_after_s=GUARD_AFTER))
    waited = gang_start_minute(params, hours=10, excludes=False)
    bound = params.ordering.queue_closed_after_s / 60 + 90
    assert waited is not None and waited <= bound, waited


def test_without_reservations_the_stream_starves_it() -> None:
    # what the tests above guard: with no reservation the gang does not start in 10 h
    params = AdmissionParams(ordering=OrderingParams(max_reservations=0))
    assert gang_start_minute(params, hours=10) is None
