"""A dispatch asks Slurm once whether its object exists: the dispatcher's `lookup` right
before `submit` is that check; a submit on its own (a retried submit, a restarted adapter)
still checks and adopts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from backends.base import SubmitRequest, masked
from backends.slurm.adapter import SlurmBackend
from backends.slurm.inventory import SlurmPoolBinding
from backends.slurm.records import BatchJob, NodeRecord, SlurmJob
from backends.slurm.settings import SlurmSettings
from broker.domain.attempts import Placement, RunSnapshot
from broker.domain.spec import JobSpec

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NAME = "isthmus-01abcdefghjkmnpq-1"


@dataclass
class CountingTransport:
    """Slurm as far as submit needs it; every existence query is counted."""

    kind: str = "cli"
    queue: list[SlurmJob] = field(default_factory=list)
    checks: int = 0
    sbatch: int = 0
    sent: list[BatchJob] = field(default_factory=list)

    def nodes(self) -> list[NodeRecord]:
        return [NodeRecord(name="a100-1", partitions=("a100",), state="idle",
                           flags=frozenset(), reason="", gpu_type="a100")]

    def find(self, name: str) -> list[SlurmJob]:
        self.checks += 1
        return [j for j in self.queue if j.name == name]

    def accounting(self, *, names: Sequence[str] = (), job_ids: Sequence[str] = (),
                   since: datetime) -> list[SlurmJob]:
        self.checks += 1
        return []

    def submit(self, job: BatchJob) -> str:
        self.sbatch += 1
        self.sent.append(job)
        self.queue.append(SlurmJob(job_id=str(100 + self.sbatch), name=job.name,
                                    state="PENDING", reason="None", exit_code=None, nodes=(),
                                    partition="a100", node_count=1))
        return str(100 + self.sbatch)


def _request() -> SubmitRequest:
    spec = JobSpec.model_validate({
        "name": "train", "team": "vision", "gang": {"replicas": 1, "gpus_per_replica": 8},
        "flavors": ["a100-80g"], "entrypoint": {"command": ["python", "train.py"]},
        "max_runtime": "90m",
    })
    placement = Placement(backend="slurm", backend_instance="slurm-local", pool="slurm-a100",
                          flavor="a100-80g")
    return SubmitRequest(job_id="01abcdefghjkmnpq", attempt=1, name=NAME,
                         snapshot=RunSnapshot.of(spec), placement=placement)


def _adapter(transport: CountingTransport) -> SlurmBackend:
    return SlurmBackend("slurm-local", [SlurmPoolBinding("slurm-a100", "a100", "a100-80g")],
                        SlurmSettings(user="isthmus"), transport,  # type: ignore[arg-type]
                        clock=lambda: NOW)


def test_lookup_then_submit_checks_existence_once() -> None:
    t = CountingTransport()
    backend = _adapter(t)
    assert backend.lookup(NAME) is None
    checks_by_lookup = t.checks  # the queue, then accounting
    result = backend.submit(_request())
    assert not result.adopted and t.sbatch == 1
    assert t.checks == checks_by_lookup == 2


def test_a_submit_on_its_own_still_checks_and_adopts() -> None:
    t = CountingTransport()
    first = _adapter(t).submit(_request())
    assert t.checks == 2 and t.sbatch == 1
    again = _adapter(t).submit(_request())  # a restarted adapter: nothing looked up
    assert again.adopted and again.backend_id == first.backend_id and t.sbatch == 1


def test_a_look_is_used_once() -> None:
    t = CountingTransport()
    backend = _adapter(t)
    assert backend.lookup(NAME) is None
    first = backend.submit(_request())
    again = backend.submit(_request())  # no fresh look: it asks Slurm and adopts
    assert again.adopted and again.backend_id == first.backend_id and t.sbatch == 1


def test_submit_returns_the_script_it_sent_as_render_shows_it() -> None:
    """What dispatch records comes from submit (no second render): the script sent, as
    `render` of the masked request shows it (the progress token is nobody's to read)."""
    t = CountingTransport()
    backend = _adapter(t)
    request = replace(_request(), env={"ISTHMUS_PROGRESS_TOKEN": "s3cret"})
    result = backend.submit(request)
    assert t.sent[0].script == backend.render(request)
    assert result.rendered == backend.render(masked(request)) != t.sent[0].script
    again = _adapter(t).submit(request)  # adopted: the same record
    assert again.adopted and again.rendered == result.rendered
