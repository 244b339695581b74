"""SlurmBackend: the backends.base.Backend protocol over a CLI or slurmrestd transport."""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from backends.base import (
    CancelResult,
    RankLog,
    SubmitRequest,
    SubmitResult,
    Unsupported,
    masked,
)
from backends.slurm import containers, script
from backends.slurm.classify import (
    ClassifyPolicy,
    Evidence,
    NodeCondition,
    classify,
)
from backends.slurm.evidence import NODE_EVIDENCE_STATES, EndEvidence
from backends.slurm.inventory import ISTHMUS_PREFIX, SlurmPoolBinding, pool_snapshots, split_name
from backends.slurm.output import read_output
from backends.slurm.records import TERMINAL, BatchJob, NodeRecord, SlurmJob, newest
from backends.slurm.settings import SlurmSettings
from backends.slurm.signals import send_signal
from backends.slurm.transport import Transport
from broker.domain.facts import Fact, Finding, Phase
from broker.domain.failures import FailureCategory
from broker.domain.inventory import InventorySnapshot
from broker.domain.reasons import Reason
from broker.logs import get_logger

log = get_logger(__name__)
# How long a `lookup` that found a name nowhere stands in for submit's own check: only the
# dispatcher creates a given name, and it looks it up right before submitting it.
ABSENT_CHECK_TTL_S = 30.0


class SlurmBackend:
    """One Slurm cluster. Talks through ``transport``; builds facts and inventory from it."""

    kind = "slurm"
    def __init__(
        self,
        name: str,
        pools: Sequence[SlurmPoolBinding],
        settings: SlurmSettings,
        transport: Transport,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.name = name
        self.pools = {p.name: p for p in pools}
        self.settings = settings
        self.transport = transport
        self.clock = clock
        self.policy = ClassifyPolicy(oom_is_user_error=settings.oom_is_user_error,
                                     infra_drain_reasons=settings.infra_drain_reasons)
        self.own_user = settings.user or settings.rest_user or pwd.getpwuid(os.getuid()).pw_name
        self._gpu_types: dict[str, str] = {}
        self._node_gpu_types: dict[str, str] = {}  # node -> its GPU type (the run's GPU model)
        self._last_seen: dict[str, SlurmJob] = {}  # name -> last queue record (exit codes)
        self._known_ids: dict[str, str] = {}  # name -> Slurm job id
        self._looked_up_absent: dict[str, float] = {}
        """Names `lookup` just found nowhere (monotonic time of the look): the dispatcher looks
        a name up right before it submits it, so submit need not ask Slurm again. Lost on a
        restart at no cost: submit then checks for itself."""
        self._kill_at: dict[str, float] = {}  # Slurm job id -> monotonic deadline
        self._end = EndEvidence(name, transport, self.policy)

    # -- inventory ----------------------------------------------------------------------------

    def inventory(self) -> InventorySnapshot:
        self.transport.dialect()
        nodes = self.transport.nodes()
        switches = self.transport.topology()
        jobs = self.transport.jobs()
        self._remember_gpu_types(nodes)
        now = self.clock()
        # sbatch --exclude keeps queued jobs off nodes held for a starving gang; the slurmrestd
        # transport does not send it, so its pools fall back to closing the queue
        pools = pool_snapshots(self.name, list(self.pools.values()), nodes, switches, jobs, now,
                               excludes_nodes=self.transport.kind == "cli",
                               runs_images=self.settings.container.runs_images)
        return InventorySnapshot(taken_at=now, pools=pools)

    def _remember_gpu_types(self, nodes: Sequence[NodeRecord]) -> None:
        for node in nodes:
            if node.gpu_type:
                self._node_gpu_types[node.name] = node.gpu_type
            for part in node.partitions:
                if node.gpu_type:
                    self._gpu_types.setdefault(part, node.gpu_type)

    def _gpu_type(self, partition: str) -> str:
        if partition not in self._gpu_types:
            self._remember_gpu_types(self.transport.nodes())
        return self._gpu_types.get(partition, "")

    # -- submit -------------------------------------------------------------------------------

    def _partition(self, pool: str) -> str:
        binding = self.pools.get(pool)
        if binding is None:
            raise Unsupported(f"pool '{pool}' is not a pool of Slurm backend '{self.name}'")
        return binding.partition

    def batch_job(self, request: SubmitRequest, *, hold: bool = False,
                  begin: str | None = None) -> BatchJob:
        return self._builder(request, hold=hold, begin=begin)(request)

    def _builder(self, request: SubmitRequest, *, hold: bool = False,
                 begin: str | None = None) -> Callable[[SubmitRequest], BatchJob]:
        """Builds the batch job of `request` (or of its masked copy, as `render` shows it)
        from one look at the partition and its GPU type."""
        partition = self._partition(request.placement.pool)
        render = self.settings.render_settings()
        account = self.settings.accounts.get(request.snapshot.spec.team)
        if account:  # the team's Slurm account (fair share and limits of the site)
            render = replace(
                render, extra_directives=(*render.extra_directives, f"--account={account}"))
        gpu_type = self._gpu_type(partition)

        def build(r: SubmitRequest) -> BatchJob:
            job = script.batch_job(r, render, partition=partition, gpu_type=gpu_type,
                                   hold=hold, begin=begin)
            return replace(job, account=account) if account else job

        return build

    def render(self, request: SubmitRequest) -> str:
        """The exact batch script submit() would send (for `isthmus render`)."""
        return self.batch_job(request).script

    def _existing(self, name: str) -> SlurmJob | None:
        queued = self.transport.find(name)
        if queued:
            return newest(queued)
        since = self.clock() - timedelta(seconds=self.settings.accounting_lookback_s)
        done = [r for r in self.transport.accounting(names=[name], since=since) if r.name == name]
        return newest(done) if done else None

    def submit(self, request: SubmitRequest) -> SubmitResult:
        """Idempotent by name: an object of that name (queued or in accounting) is adopted.
        Right after a `lookup` that found the name nowhere, that look is the check (one
        existence check per dispatch, not two)."""
        build = self._builder(request)
        job, shown = build(request), build(masked(request)).script
        looked = self._looked_up_absent.pop(request.name, None)
        fresh = looked is not None and time.monotonic() - looked < ABSENT_CHECK_TTL_S
        existing = None if fresh else self._existing(request.name)
        if existing is not None:
            self._known_ids[request.name] = existing.job_id
            log.info("slurm %s: adopted %s as job %s", self.name, request.name, existing.job_id)
            return SubmitResult(name=request.name, backend_id=existing.job_id, adopted=True,
                                rendered=shown)
        try:
            as_user = self.settings.unix_user(request.owner)
        except ValueError as exc:
            raise Unsupported(f"submit_as_owner: {exc}") from None
        job_id = (self.transport.submit(job) if as_user is None
                  else self.transport.submit(job, as_user=as_user))
        self._known_ids[request.name] = job_id
        return SubmitResult(name=request.name, backend_id=job_id, adopted=False,
                            rendered=shown)

    # -- observe ------------------------------------------------------------------------------

    def _fact(self, rec: SlurmJob, now: datetime) -> Fact:
        if (rec.state in NODE_EVIDENCE_STATES and rec.nodes
                and not self._end.complete(rec.job_id)):
            return self._ending(rec, now)
        cached = self._last_seen.get(rec.name)
        exit_code, signal = rec.exit_code, rec.signal
        if (exit_code is None and signal is None and cached is not None
                and cached.job_id == rec.job_id and cached.state in TERMINAL):
            exit_code, signal = cached.exit_code, cached.signal  # seen before it left the queue
        requested = rec.node_count
        conditions: Mapping[str, Sequence[NodeCondition]] = self._end.nodes.get(rec.job_id, {})
        got = classify(Evidence(state=rec.state, reason=rec.reason, exit_code=exit_code,
                                signal=signal, cancelled_by=rec.cancelled_by,
                                own_user=self.own_user, nodes_allocated=len(rec.nodes),
                                nodes_requested=requested, nodes=rec.nodes,
                                node_conditions=conditions,
                                steps=self._end.steps.get(rec.job_id)), self.policy)
        job_id, attempt = split_name(rec.name)
        got, image_ids = containers.with_image(got, rec.comment)
        timed = replace(got, submitted_at=rec.submitted_at, started_at=rec.started_at,
                        ended_at=rec.ended_at)
        return timed.fact(
            backend=self.name, backend_name=rec.name, backend_id=rec.job_id, job_id=job_id,
            attempt=attempt, observed_at=now, image_ids=image_ids,
            gpu_models=tuple(sorted({self._node_gpu_types[n] for n in rec.nodes
                                     if n in self._node_gpu_types})),
        )

    def _ending(self, rec: SlurmJob, now: datetime) -> Fact:
        """A job that ended while the evidence to judge its end is incomplete: still ending,
        like a COMPLETING one (see EndEvidence.note)."""
        job_id, attempt = split_name(rec.name)
        return Finding(
            phase=Phase.RUNNING if rec.started_at else Phase.STARTING,
            reason=Reason.Running if rec.started_at else Reason.WaitingForAllRanks,
            raw_state=rec.state, raw_reason=rec.reason,
            message=f"ended {rec.state} in Slurm; waiting for accounting to record its end "
            "and its nodes' events before judging it",
            nodes=rec.nodes, submitted_at=rec.submitted_at, started_at=rec.started_at,
        ).fact(backend=self.name, backend_name=rec.name, backend_id=rec.job_id,
               job_id=job_id, attempt=attempt, observed_at=now)

    def _lost(self, name: str, now: datetime) -> Fact:
        job_id, attempt = split_name(name)
        return Finding(
            phase=Phase.LOST, reason=Reason.Orchestration, failure=FailureCategory.ORCHESTRATION,
            message="neither the Slurm queue nor its accounting knows this job",
        ).fact(backend=self.name, backend_name=name, backend_id=self._known_ids.get(name),
               job_id=job_id, attempt=attempt, observed_at=now)

    def observe(self, names: Sequence[str] | None = None) -> list[Fact]:
        """One queue call for every Isthmus job, plus one accounting call for expected jobs
        that left the queue (and for cancelled ones, to learn who cancelled them), plus, when
        a job newly ended FAILED / NODE_FAIL / BOOT_FAIL, one node listing, one node-event and
        one job-step query for all such jobs."""
        self._flush_kills()
        now = self.clock()
        queued: dict[str, list[SlurmJob]] = {}
        for rec in self.transport.jobs():
            if rec.name.startswith(ISTHMUS_PREFIX):
                queued.setdefault(rec.name, []).append(rec)
        latest = {name: newest(recs) for name, recs in queued.items()}
        missing = [n for n in (names or ()) if n not in latest]
        ask_who = [r.job_id for r in latest.values() if r.state == "CANCELLED"]
        accounted: dict[str, SlurmJob] = {}
        if missing or ask_who:
            ids = [self._known_ids[n] for n in missing if n in self._known_ids] + ask_who
            since = now - timedelta(seconds=self.settings.accounting_lookback_s)
            rows = self.transport.accounting(names=missing, job_ids=ids, since=since)
            for rec in rows:
                if rec.name.startswith(ISTHMUS_PREFIX):
                    prev = accounted.get(rec.name)
                    accounted[rec.name] = rec if prev is None else newest([prev, rec])
        gone = {name: accounted[name] for name in missing if name in accounted}
        in_view = [*latest.values(), *gone.values()]
        self._end.note(in_view, now)
        facts = []
        for name, rec in latest.items():
            acc = accounted.get(name)
            if acc is not None and acc.job_id == rec.job_id and acc.cancelled_by:
                rec = replace(rec, cancelled_by=acc.cancelled_by)
            facts.append(self._fact(rec, now))
            self._last_seen[name] = rec
            self._known_ids[name] = rec.job_id
        for name in missing:
            facts.append(self._fact(gone[name], now) if name in gone else self._lost(name, now))
        # forget jobs out of view: the broker stops asking once it has acted on their end
        seen = {r.job_id for r in in_view}
        self._end.keep_only(seen)
        if names is not None:  # jobs neither asked about nor in the queue: forget them
            keep = set(names) | set(latest)
            self._last_seen = {k: v for k, v in self._last_seen.items() if k in keep}
            self._known_ids = {k: v for k, v in self._known_ids.items() if k in keep}
        return facts

    def lookup(self, name: str) -> Fact | None:
        rec = self._existing(name)
        if rec is None:
            now_t = time.monotonic()
            self._looked_up_absent = {  # keep only looks that can still stand in
                k: t for k, t in self._looked_up_absent.items() if now_t - t < ABSENT_CHECK_TTL_S}
            self._looked_up_absent[name] = now_t
            return None
        self._looked_up_absent.pop(name, None)
        now = self.clock()
        self._end.note([rec], now)
        return self._fact(rec, now)

    def logs(self, name: str, rank: int | None = None,
             tail: int | None = None) -> list[RankLog]:
        """The job's output file (output.read_output), found through the job's id."""
        rec = self._existing(name)
        if rec is None:
            return []
        return read_output(self.settings.work_dir, name, rec.job_id, rank, tail)

    # -- cancel -------------------------------------------------------------------------------

    def cancel(self, name: str, grace_seconds: int) -> CancelResult:
        """Pending jobs are cancelled at once. Running ones get USR1 in the batch shell, which
        sends the job's own stop signal (checkpoint.signal, e.g. sbatch's --signal=USR2) on to
        its step (every rank, or the user's script); the kill follows after
        ``grace_seconds``, issued by the next observe()/cancel() call at or after the deadline
        (the broker calls observe every cycle). A broker restart loses the deadline; the
        reconciler's orphan cancel repeats it.
        """
        self._flush_kills()
        queued = [r for r in self.transport.find(name) if r.state not in TERMINAL]
        if not queued:
            return CancelResult(name=name, found=False, signalled=False,
                                message="no active Slurm job with this name")
        messages, signalled = [], False
        for rec in queued:
            if rec.state == "RUNNING" and grace_seconds > 0:
                if rec.job_id in self._kill_at:
                    messages.append(f"job {rec.job_id}: already signalled, kill pending")
                    signalled = True
                elif self.transport.signal(rec.job_id, "USR1"):
                    self._kill_at[rec.job_id] = time.monotonic() + grace_seconds
                    signalled = True
                    messages.append(f"job {rec.job_id}: USR1 sent, kill in {grace_seconds}s")
                    continue
            if rec.job_id not in self._kill_at:
                self.transport.cancel(rec.job_id)
                messages.append(f"job {rec.job_id} ({rec.state}): cancelled")
        return CancelResult(name=name, found=True, signalled=signalled,
                            message="; ".join(messages))

    def send_signal(self, name: str, signal: str, whom: str = "steps") -> str:
        """iscancel --signal [-b|-f]"""
        return send_signal(self.transport, name, signal, whom)

    def _flush_kills(self) -> None:
        now = time.monotonic()
        for job_id, deadline in list(self._kill_at.items()):
            if deadline <= now:
                self.transport.cancel(job_id)
                del self._kill_at[job_id]

    def close(self) -> None:
        self.transport.close()
