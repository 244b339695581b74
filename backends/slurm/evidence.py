"""How long the evidence of a job's end is waited for and counted: the health of its nodes
(their state, their recorded down / drain / fail events) and accounting's record of the end.
`EndEvidence` gathers it for the adapter's observe and lookup."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from backends.slurm.classify import ClassifyPolicy, NodeCondition, event_in_run, node_fault
from backends.slurm.records import SlurmJob
from backends.slurm.transport import Transport
from broker.logs import get_logger

log = get_logger(__name__)

# Ends that the health of the job's nodes can explain (or, for NODE_FAIL, name the culprit of).
NODE_EVIDENCE_STATES = {"FAILED", "NODE_FAIL", "BOOT_FAIL"}
# How long after a job's end its nodes' troubles still count: slurmctld declares a node whose
# slurmd died DOWN only after SlurmdTimeout (300 s by default), and meanwhile the job's script
# may already have failed. Beyond this the node's current state says nothing about the job.
NODE_EVIDENCE_WINDOW = timedelta(seconds=600)
# How long after a job's end a node event may begin and still count as this job's: both times
# are slurmctld's, in whole seconds, taken in the same handling of the node's failure (the
# job's end is the node's "down" or a moment after it), so a little slack covers the
# recording. Not more: an event a minute after the end is the next job's (a node that failed
# after the job's script did is still down when the end is seen, which the current state
# tells, see NODE_EVIDENCE_WINDOW).
NODE_EVENT_SLACK = timedelta(seconds=10)
# How long the judgment of such an end may wait for accounting to record it (and the node
# events before it): slurmdbd lags slurmctld by a second or so, more on a busy machine.
END_EVIDENCE_WAIT = timedelta(seconds=60)


class EndEvidence:
    """The evidence for judging the jobs of one Slurm backend that ended in a state their
    nodes' health can explain, per Slurm job id: the nodes' conditions (`nodes`, once the
    evidence is complete), the steps accounting recorded (`steps`) and when the end was first
    seen (while the evidence is incomplete)."""

    def __init__(self, backend: str, transport: Transport, policy: ClassifyPolicy) -> None:
        self.backend = backend
        self.transport = transport
        self.policy = policy
        self.nodes: dict[str, dict[str, tuple[NodeCondition, ...]]] = {}
        self.steps: dict[str, tuple[str, ...]] = {}
        self.first_seen: dict[str, datetime] = {}

    def complete(self, job_id: str) -> bool:
        return job_id in self.nodes

    def keep_only(self, job_ids: set[str]) -> None:
        """Forget jobs out of view: the broker stops asking once it has acted on their end."""
        self.nodes = {k: v for k, v in self.nodes.items() if k in job_ids}
        self.steps = {k: v for k, v in self.steps.items() if k in job_ids}
        self.first_seen = {k: v for k, v in self.first_seen.items()
                           if k in job_ids and k not in self.nodes}

    def note(self, recs: Iterable[SlurmJob], now: datetime) -> None:
        """Record the evidence for judging jobs that newly ended in a state their nodes' health
        can explain: the steps accounting recorded for them (one query; it also tells whether
        accounting has recorded their end yet), the nodes' current state (one node listing)
        and the down / drain / fail events that accounting recorded for them around the job's
        own run (one query, see classify.event_in_run), for all such jobs at once and never in
        a cycle without one. Kept per job once complete, so the classification is that of the
        moment the evidence was complete and does not flip once an admin resumes the node.

        Complete means: accounting has recorded the job's end, and, when Slurm says that a
        node of the job failed (NODE_FAIL, or the reason NodeDown) but no node of the
        allocation shows it, the failed node's event has arrived. slurmctld hands both to
        slurmdbd asynchronously (seen: the event of a node set DOWN arrived after the job's
        NODE_FAIL end, and seconds late on a busy machine), while its node may already be back
        in service. Until then the job is reported as still ending; after END_EVIDENCE_WAIT
        it is judged with what is known."""
        fresh = [r for r in recs if r.state in NODE_EVIDENCE_STATES and r.nodes
                 and r.job_id not in self.nodes]
        if not fresh:
            return
        for rec in fresh:
            self.first_seen.setdefault(rec.job_id, now)
        # did the ranks start at all? (no srun step: the job's code never ran)
        recorded = self.transport.steps([r.job_id for r in fresh])
        self.steps.update(recorded)
        listed = {n.name: n for n in self.transport.nodes()}
        names = sorted({n for r in fresh for n in r.nodes})
        since = min(r.started_at or r.submitted_at or now for r in fresh)
        events = self.transport.node_events(names, since=since)
        for rec in fresh:
            start = rec.started_at or rec.submitted_at or since
            end = rec.ended_at or now
            seen: dict[str, list[NodeCondition]] = {n: [] for n in rec.nodes}
            for name in rec.nodes:
                node = listed.get(name)
                if node is not None and now <= end + NODE_EVIDENCE_WINDOW:
                    seen[name].append(NodeCondition(node.state, node.flags, node.reason))
            for ev in events:
                if ev.node in seen and event_in_run(ev.start, ev.end, start, end,
                                                    NODE_EVENT_SLACK):
                    at = f"recorded {ev.start:%Y-%m-%dT%H:%M:%SZ}" if ev.start else "recorded"
                    seen[ev.node].append(NodeCondition(ev.state, ev.flags, ev.reason, at))
            conditions = {n: tuple(c) for n, c in seen.items() if c}
            missing = self._missing(rec, recorded, conditions)
            if missing and now - self.first_seen[rec.job_id] < END_EVIDENCE_WAIT:
                continue  # asked again next cycle
            if missing:
                log.warning("slurm %s: judging job %s (%s) without %s after %ss", self.backend,
                            rec.job_id, rec.state, missing,
                            int(END_EVIDENCE_WAIT.total_seconds()))
            self.nodes[rec.job_id] = conditions

    def _missing(self, rec: SlurmJob, recorded: Mapping[str, tuple[str, ...]],
                 conditions: Mapping[str, Sequence[NodeCondition]]) -> str:
        """What the evidence for judging this ended job still lacks ("" if nothing)."""
        if rec.source != "accounting" and rec.job_id not in recorded:
            return "its end in accounting"
        node_failed = rec.state == "NODE_FAIL" or rec.reason == "NodeDown"
        if (node_failed and getattr(self.transport, "serves_node_events", True)
                and not any(node_fault(c, self.policy)
                            for cs in conditions.values() for c in cs)):
            return "the failed node's event"
        return ""
