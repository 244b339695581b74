"""`kind: sim` in isthmus.yaml: built through the same registry and wiring as Slurm and
Kubernetes, checked with its own schema, serving as the kind it emulates; and what a simulated
job does on its own: faults by annotation or rate, progress and checkpoints, resume, foreign
load, wall time at a speed."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from backends.base import SubmitRequest
from backends.sim import (
    FAIL_ANNOTATION,
    ExternalLoad,
    Fault,
    LiveSimBackend,
    SimBackend,
    SimClock,
    SimFailures,
    SimPoolSpec,
    WallClock,
)
from backends.sim.progress import Report
from broker.config import parse_config
from broker.domain import FailureCategory, RunSnapshot
from broker.domain.attempts import Placement
from broker.domain.facts import Phase
from broker.domain.spec import BackendKind, JobSpec
from broker.feasibility import feasibility
from broker.wiring.runtime import build_backends, check_backends
from tests.builders import spec
from tests.harness.paths import EXAMPLE_CONFIG

BASE: dict[str, Any] = yaml.safe_load(EXAMPLE_CONFIG.read_text())
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def test_the_example_builds_simulated_backends_through_the_wiring() -> None:
    config = parse_config(copy.deepcopy(BASE))
    assert check_backends(config) == []
    backends = build_backends(config)
    assert set(backends) == {"sim-slurm", "sim-k8s"}
    assert all(isinstance(b, LiveSimBackend) for b in backends.values())
    assert (backends["sim-slurm"].kind, backends["sim-k8s"].kind) == ("slurm", "k8s")
    pools = {p.name: p for b in backends.values() for p in b.inventory().pools}
    assert set(pools) == {"slurm-h100", "slurm-a100", "k8s-h100", "k8s-a100"}
    h100 = pools["slurm-h100"]
    assert h100.backend_kind is BackendKind.SLURM and h100.total_gpus == 24
    assert [n.topology.rack for n in h100.nodes] == ["r0", "r0", "r1"]  # 3 nodes, 2 per rack
    assert h100.nodes[0].cpus == 96 and h100.nodes[0].memory_bytes == 2**40
    k8s = pools["k8s-a100"]
    assert k8s.backend_kind is BackendKind.K8S
    assert k8s.free_gpus == 56  # foreign_load 0.125: one node of eight busy
    sim = backends["sim-slurm"]
    assert isinstance(sim, SimBackend) and sim.reporter is not None
    assert sim.reporter.url == "http://127.0.0.1:8080"  # the broker's own listener


def test_a_simulated_backend_serves_as_the_kind_it_emulates() -> None:
    config = parse_config(copy.deepcopy(BASE))
    assert [b.serves_as for b in config.backends] == [BackendKind.SLURM, BackendKind.K8S]
    assert feasibility(config, spec().backend("slurm").build()).ok
    assert feasibility(config, spec().backend("k8s").build()).ok
    with pytest.raises(ValueError, match="backend"):
        JobSpec.model_validate({**spec().build().model_dump(mode="json"), "backend": "sim"})


def _settings(**values: Any) -> Any:
    def mutate(c: dict[str, Any]) -> None:
        c["backends"][0]["settings"].update(values)
    return mutate


@pytest.mark.parametrize(
    ("mutate", "line"),
    [
        (_settings(sped=2), "backends[0].settings.sped: unknown sim backend setting; did you "
                            "mean 'speed'?"),
        (_settings(emulate="pbs"), "backends[0].settings.emulate: Input should be 'slurm' or "
                                   "'k8s'"),
        (_settings(speed=0), "backends[0].settings.speed: Input should be greater than 0"),
        (_settings(faults={"oom": 2}), "backends[0].settings.faults.oom: Input should be less "
                                       "than or equal to 1"),
        (_settings(pools={"elsewhere": {}}), "backends[0].settings.pools.elsewhere: no pool "
                                             "elsewhere on this backend"),
        (lambda c: c["pools"][0].pop("capacity"), "pools[0].capacity: a simulated pool needs "
                                                  "its shape"),
    ],
    ids=["typo", "emulate", "speed", "fault-rate", "pool-extras-of-no-pool", "no-capacity"],
)
def test_sim_settings_problems_name_their_path(mutate: Any, line: str) -> None:
    data = copy.deepcopy(BASE)
    mutate(data)
    problems = check_backends(parse_config(data))
    assert any(p.startswith(line) for p in problems), problems


POOL = SimPoolSpec("p1", "h100", blocks=1, racks_per_block=2, nodes_per_rack=2, gpus_per_node=8)


class Reports:
    def __init__(self) -> None:
        self.sent: list[Report] = []

    def send(self, report: Report) -> None:
        self.sent.append(report)


def make(**kw: Any) -> SimBackend:
    return SimBackend("sim-a", "slurm", [POOL], SimClock(T0), failures=SimFailures(
        start_delay_s=10), **kw)


def request(attempt: int = 1, env: dict[str, str] | None = None, **fields: Any) -> SubmitRequest:
    s = spec().replicas(2).gpus(8).set("max_runtime", 3600)
    for key, value in fields.items():
        s = s.set(key, value)
    snapshot = RunSnapshot.of(s.build())
    placement = Placement(backend=BackendKind.SLURM, backend_instance="sim-a", pool="p1",
                          flavor="h100")
    return SubmitRequest(job_id="j1", attempt=attempt, name=f"isthmus-j1-{attempt}",
                         snapshot=snapshot, placement=placement,
                         env=env or {"ISTHMUS_PROGRESS_TOKEN": "tok"})


@pytest.mark.parametrize(
    ("fault", "category", "words", "bad_node"),
    [
        (Fault.NODE_LOSS, FailureCategory.INFRA_TRANSIENT, "node loss", True),
        (Fault.OOM, FailureCategory.USER_ERROR, "OOMKilled", False),
        (Fault.IMAGE_PULL, FailureCategory.RESOURCE_ENV, "ErrImagePull", False),
    ],
    ids=["node-loss", "oom", "image-pull"],
)
def test_an_annotated_fault_strikes_the_first_attempt_only(
    fault: Fault, category: FailureCategory, words: str, bad_node: bool
) -> None:
    b = make()
    ann = {FAIL_ANNOTATION: fault.value, "isthmus.io/sim-duration": "100"}
    b.submit(request(annotations=ann))
    b.advance(200)
    fact = b.lookup("isthmus-j1-1")
    assert fact is not None and fact.phase is Phase.FAILED and fact.failure is category
    assert words in fact.message and bool(fact.bad_nodes) is bad_node
    b.submit(request(attempt=2, annotations=ann))
    b.advance(200)
    assert b.lookup("isthmus-j1-2").phase is Phase.SUCCEEDED  # type: ignore[union-attr]


def test_fault_rates_fail_attempts() -> None:
    b = SimBackend("sim-a", "slurm", [POOL], SimClock(T0),
                   failures=SimFailures(fault_rates=((Fault.OOM, 1.0),)))
    b.submit(request())
    b.advance(10_000)
    assert b.lookup("isthmus-j1-1").failure is FailureCategory.USER_ERROR  # type: ignore[union-attr]


def test_progress_checkpoints_and_resume() -> None:
    reports = Reports()
    b = make(reporter=reports, progress_every=30)
    fields: dict[str, Any] = {"annotations": {"isthmus.io/sim-duration": "300"},
              "checkpoint": {"dir": "/ckpt/j1", "interval": 60, "resumable": True}}
    b.submit(request(**fields))
    for _ in range(15):
        b.advance(10)  # 150 s: 140 s of work after the 10 s start
    steps = [r.step for r in reports.sent]
    assert steps == [0, 30, 60, 90, 120]  # every 30 s of the 140 s of work
    assert {r.token for r in reports.sent} == {"tok"}
    assert [r.checkpoint for r in reports.sent if r.checkpoint] == ["/ckpt/j1/step-60",
                                                                    "/ckpt/j1/step-120"]
    assert all(r.running() for r in reports.sent)
    b.cancel("isthmus-j1-1", 0)  # preempted
    assert not any(r.running() for r in reports.sent)  # a report still queued is not sent
    resume = {"ISTHMUS_PROGRESS_TOKEN": "tok2", "ISTHMUS_RESUME_FROM": "/ckpt/j1"}
    b.submit(request(attempt=2, env=resume, **fields))
    b.advance(10 + 180 - 1)
    assert b.lookup("isthmus-j1-2").phase is Phase.RUNNING  # type: ignore[union-attr]
    b.advance(2)  # 300 s of work: 120 restored + 180 run
    assert b.lookup("isthmus-j1-2").phase is Phase.SUCCEEDED  # type: ignore[union-attr]
    assert reports.sent[-1].token == "tok2" and reports.sent[-1].step > 120


def test_the_running_jobs_are_gone_over_at_most_once_a_simulated_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every call of the backend syncs it (a dispatched job costs a lookup and a submit): a
    pass over every running job's progress on each call was a third of the simulator's CPU at
    100 submits/s, on the machine the soak measures."""
    b = make(reporter=Reports(), progress_every=30)
    b.submit(request(annotations={"isthmus.io/sim-duration": "300"}))
    passes: list[float] = []
    progress = b._progress

    def counted() -> None:
        passes.append(b._t)
        progress()

    monkeypatch.setattr(b, "_progress", counted)
    for _ in range(100):
        b.advance(0.01)  # a second in all, a call every hundredth
        b.lookup("isthmus-j1-1")
    assert 1 <= len(passes) <= 2


def test_a_checkpoint_written_since_the_last_pass_is_kept_when_the_job_ends() -> None:
    """The running jobs are gone over once a simulated second: a job that crossed a
    checkpoint since then and is cancelled (preempted) now resumes from that checkpoint."""
    b = make(reporter=Reports(), progress_every=30)
    b.submit(request(annotations={"isthmus.io/sim-duration": "300"},
                     checkpoint={"dir": "/ckpt/j1", "interval": 60, "resumable": True}))
    b.advance(0.01)
    job = b.jobs["isthmus-j1-1"]
    assert job.started is not None
    work_starts = job.started + b.failures.start_delay_s
    b.advance(work_starts + 59.5 - b._t)  # a pass at 59.5 s of work: no checkpoint yet
    assert "j1" not in b.checkpoints
    b.advance(0.6)  # 60.1 s of work, within the second: no pass
    b.cancel("isthmus-j1-1", 0)
    assert b.checkpoints["j1"] == 60


def test_no_reports_without_a_reporter() -> None:
    b = make()
    b.submit(request(annotations={"isthmus.io/sim-duration": "100"}))
    b.advance(50)
    assert b.lookup("isthmus-j1-1").phase is Phase.RUNNING  # type: ignore[union-attr]
    assert not b._reporting  # nothing to report to, nothing to checkpoint


def test_foreign_load_holds_whole_nodes() -> None:
    b = SimBackend("sim-a", "slurm", [POOL], SimClock(T0), external=ExternalLoad(occupied=0.5))
    nodes = b.inventory().pools[0].nodes
    assert sorted(n.free_gpus for n in nodes) == [0, 0, 8, 8]
    assert b.observe() == []  # foreign work is not Isthmus's


def test_wall_clock_runs_at_its_speed() -> None:
    now = [1000.0]
    clock = WallClock(speed=10, wall=lambda: now[0])
    now[0] += 3
    assert clock.t == pytest.approx(30)
    assert (clock.now - clock.start).total_seconds() == pytest.approx(3)  # reported in wall time
    with pytest.raises(TypeError):
        clock.advance(1)


def test_outage_file_makes_the_backend_unreachable_while_it_exists(tmp_path: Any) -> None:
    from backends.base import BackendUnavailable

    flag = tmp_path / "outage"
    config = copy.deepcopy(BASE)
    config["backends"][0]["settings"]["outage_file"] = str(flag)
    backends = build_backends(parse_config(config))
    sim, other = backends["sim-slurm"], backends["sim-k8s"]
    assert sim.inventory().pools  # no file: answers
    flag.write_text("")
    with pytest.raises(BackendUnavailable, match="outage drill"):
        sim.inventory()
    with pytest.raises(BackendUnavailable):
        sim.observe()
    assert other.inventory().pools  # only the backend that names the file
    flag.unlink()
    assert sim.inventory().pools
