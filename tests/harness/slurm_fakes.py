"""A Slurm adapter over a fake transport: the queue, accounting, node list and node events are
set by the test, and the calls into them are counted."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from backends.slurm.adapter import SlurmBackend
from backends.slurm.inventory import SlurmPoolBinding
from backends.slurm.records import BatchJob, NodeEvent, NodeRecord, SlurmJob, Switch
from backends.slurm.settings import SlurmSettings
from backends.slurm.versions import Dialect

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
STARTED = NOW - timedelta(minutes=10)
ENDED = NOW - timedelta(seconds=20)
GANG = ("a100-1", "a100-2")


def node(name: str, state: str = "allocated", *flags: str, reason: str = "") -> NodeRecord:
    return NodeRecord(name=name, partitions=("a100",), state=state, flags=frozenset(flags),
                      reason=reason)


def job(job_id: str, state: str, *, name: str = "", exit_code: int | None = None,
        nodes: tuple[str, ...] = GANG, ended_at: datetime = ENDED) -> SlurmJob:
    running = state in ("RUNNING", "PENDING")
    return SlurmJob(job_id=job_id, name=name or f"isthmus-j{job_id}-1", state=state,
                     reason="NonZeroExitCode" if state == "FAILED" else "None",
                     exit_code=exit_code, nodes=nodes, partition="a100", node_count=len(nodes),
                     started_at=STARTED, ended_at=None if running else ended_at)


def event(name: str, state: str, reason: str, start: datetime, *flags: str,
          end: datetime | None = None) -> NodeEvent:
    return NodeEvent(node=name, state=state, flags=frozenset(flags), reason=reason, start=start,
                     end=end if end is not None else start)


@dataclass
class FakeTransport:
    """The queue, accounting and node list are set by the test; node listings are counted."""

    kind: str = "cli"
    queue: list[SlurmJob] = field(default_factory=list)
    accounted: list[SlurmJob] = field(default_factory=list)
    node_list: list[NodeRecord] = field(default_factory=list)
    events: list[NodeEvent] = field(default_factory=list)
    node_calls: int = 0
    event_calls: list[tuple[tuple[str, ...], datetime]] = field(default_factory=list)
    step_map: dict[str, tuple[str, ...]] = field(default_factory=dict)
    step_calls: list[tuple[str, ...]] = field(default_factory=list)
    unrecorded: set[str] = field(default_factory=set)  # ended, end not yet in accounting
    serves_node_events: bool = True

    def dialect(self) -> Dialect:
        raise NotImplementedError

    def nodes(self) -> list[NodeRecord]:
        self.node_calls += 1
        return list(self.node_list)

    def node_events(self, nodes: Sequence[str], *, since: datetime) -> list[NodeEvent]:
        self.event_calls.append((tuple(nodes), since))
        return [e for e in self.events if e.node in nodes]

    def steps(self, job_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """Accounting has recorded every end (ranks launched) but those in ``unrecorded``."""
        self.step_calls.append(tuple(job_ids))
        return {j: self.step_map.get(j, ("batch", "extern", "0")) for j in job_ids
                if j not in self.unrecorded}

    def topology(self) -> list[Switch]:
        return []

    def jobs(self) -> list[SlurmJob]:
        return list(self.queue)

    def find(self, name: str) -> list[SlurmJob]:
        return [j for j in self.queue if j.name == name]

    def accounting(self, *, names: Sequence[str] = (), job_ids: Sequence[str] = (),
                   since: datetime) -> list[SlurmJob]:
        return [j for j in self.accounted if j.name in names or j.job_id in job_ids]

    def submit(self, job: BatchJob, *, as_user: str | None = None) -> str:
        raise NotImplementedError

    def signal(self, job_id: str, signal: str) -> bool:
        return False

    def signal_steps(self, job_id: str, signal: str) -> bool:
        return False

    def signal_full(self, job_id: str, signal: str) -> bool:
        return False

    def cancel(self, job_id: str) -> bool:
        return False

    def close(self) -> None:
        return None


def make(transport: FakeTransport, infra_drain_reasons: tuple[str, ...] = (),
         clock: Callable[[], datetime] = lambda: NOW) -> SlurmBackend:
    settings = SlurmSettings(user="isthmus", infra_drain_reasons=infra_drain_reasons)
    return SlurmBackend("slurm-local", [SlurmPoolBinding("slurm-a100", "a100", "a100-80g")],
                        settings, transport, clock=clock)


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now
