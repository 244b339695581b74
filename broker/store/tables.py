"""SQLModel tables. The schema itself is created by the versioned migrations, not by these."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on both databases (SQLite stores no zone; we always mean UTC)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use broker.store.utcnow()")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class JobRow(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (
        sa.UniqueConstraint("team", "idempotency_key", name="uq_jobs_team_idempotency_key"),
        sa.Index("ix_jobs_team_state", "team", "state"),
        sa.Index("ix_jobs_state", "state"),
    )

    id: str = Field(primary_key=True, max_length=16)
    name: str = Field(max_length=63)
    team: str = Field(max_length=63)
    queue: str = Field(max_length=63)
    priority: str = Field(max_length=63)
    state: str = Field(max_length=16)
    reason: str = Field(max_length=40)
    message: str = Field(default="", sa_type=sa.Text)
    attempt: int = 0
    last_seq: int = 0
    total_gpus: int
    spec_json: str = Field(sa_type=sa.Text)
    spec_hash: str = Field(max_length=64)
    idempotency_key: str | None = Field(default=None, max_length=255)
    submitted_by: str = Field(max_length=255)
    created_at: datetime = Field(sa_type=UTCDateTime)
    updated_at: datetime = Field(sa_type=UTCDateTime)
    first_useful_work_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    not_before: datetime | None = Field(default=None, sa_type=UTCDateTime)
    exclude_json: str = Field(default="{}", sa_type=sa.Text)
    # the job's number (HPC tools parse digits; broker/store/job_numbers.py); an array task's
    # array number (its first task's) and index. Unique index uq_jobs_number, ix_jobs_array.
    number: int | None = Field(default=None, sa_type=sa.BigInteger)
    array_number: int | None = Field(default=None, sa_type=sa.BigInteger)
    array_index: int | None = None


class JobEventRow(SQLModel, table=True):
    """Append-only: rows are inserted by set_state and never updated or deleted."""

    __tablename__ = "job_events"
    __table_args__ = (
        sa.UniqueConstraint("job_id", "seq", name="uq_job_events_job_seq"),
        sa.UniqueConstraint("job_id", "cause_key", name="uq_job_events_job_cause"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", max_length=16)
    seq: int
    at: datetime = Field(sa_type=UTCDateTime)
    from_state: str | None = Field(default=None, max_length=16)
    to_state: str = Field(max_length=16)
    reason: str = Field(max_length=40)
    message: str = Field(default="", sa_type=sa.Text)
    cause_kind: str = Field(max_length=32)
    cause_key: str | None = Field(default=None, max_length=255)
    actor: str = Field(max_length=255)
    attempt: int = 0
    facts_ref: str | None = Field(default=None, max_length=255)
    details_json: str | None = Field(default=None, sa_type=sa.Text)


class AttemptRow(SQLModel, table=True):
    __tablename__ = "attempts"
    __table_args__ = (sa.UniqueConstraint("job_id", "number", name="uq_attempts_job_number"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", max_length=16)
    number: int
    snapshot_json: str = Field(sa_type=sa.Text)
    spec_hash: str = Field(max_length=64)
    backend_name: str = Field(max_length=63)
    created_at: datetime = Field(sa_type=UTCDateTime)
    ended_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    failure: str | None = Field(default=None, max_length=32)
    backend: str = Field(default="", max_length=63)
    pool: str = Field(default="", max_length=63)
    flavor: str = Field(default="", max_length=63)
    gpus: int = 0
    dispatch: str = Field(default="pending", max_length=16)  # the outbox: pending -> created
    backend_id: str | None = Field(default=None, max_length=255)
    dispatched_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    phase: str = Field(default="PENDING", max_length=16)
    last_seen_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    missing_since: datetime | None = Field(default=None, sa_type=UTCDateTime)
    preempted: bool = False
    progress_token_sha256: str | None = Field(default=None, max_length=64)
    last_step: int | None = None
    last_progress_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    rendered: str | None = Field(default=None, sa_type=sa.Text)
    resolved_json: str | None = Field(default=None, sa_type=sa.Text)  # written once, at start
    # the last checkpoint the attempt reported (progress API): where, at which step, when
    checkpoint_path: str | None = Field(default=None, max_length=1024)
    checkpoint_step: int | None = None
    checkpoint_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # the retry engine's answer for an attempt that ended in a failure or a preemption,
    # written in the transaction that ended it (broker.control.requeue): retry, stop, none
    retry_decision: str | None = Field(default=None, max_length=16)
    # a preemption's intent, committed before its backend object is signalled: an ending
    # seen after a crash between the signal and the preemption's commit is the preemption's
    preempt_signalled_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class LedgerEntryRow(SQLModel, table=True):
    """Append-only quota ledger. One entry per (job, attempt, kind): reserve, release, usage,
    waste. `quota_usage` holds the live reservations per (team, flavor), updated in the same
    transaction as the entry."""

    __tablename__ = "ledger_entries"
    __table_args__ = (
        sa.UniqueConstraint("job_id", "attempt", "kind", name="uq_ledger_job_attempt_kind"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", max_length=16)
    attempt: int
    kind: str = Field(max_length=16)
    team: str = Field(max_length=63)
    flavor: str = Field(max_length=63)
    gpus: int
    borrowed_gpus: int = 0
    gpu_hours: float = 0.0
    at: datetime = Field(sa_type=UTCDateTime)
    note: str = Field(default="", sa_type=sa.Text)
    cost: float | None = None  # gpu_hours x flavor x pool cost weight (usage and waste only)
    # of usage and waste entries (revision 0010; older ones have NULL): the attempt's pool and
    # the job's submitter, so that reports group without joins
    pool: str | None = Field(default=None, max_length=63)
    submitted_by: str | None = Field(default=None, max_length=255)


class LedgerDailyRow(SQLModel, table=True):
    """The ledger's usage and waste entries summed per UTC day, group and kind (revision
    0011; written at each commit by broker.store.daily_sums since revision 0013). `dim` names
    the grouping (team, pool, flavor, user) and `value` the group; `team` is on every row, for
    team-scoped reports."""

    __tablename__ = "ledger_daily"

    dim: str = Field(primary_key=True, max_length=8)
    day: date = Field(primary_key=True)
    team: str = Field(primary_key=True, max_length=63)
    value: str = Field(primary_key=True, max_length=255)
    kind: str = Field(primary_key=True, max_length=16)
    gpu_hours: float
    cost: float
    unpriced_gpu_hours: float
    entries: int


class QuotaUsageRow(SQLModel, table=True):
    __tablename__ = "quota_usage"

    team: str = Field(primary_key=True, max_length=63)
    flavor: str = Field(primary_key=True, max_length=63)
    reserved_gpus: int = 0
    borrowed_gpus: int = 0


class LeaderLeaseRow(SQLModel, table=True):
    __tablename__ = "leader_lease"

    name: str = Field(primary_key=True, max_length=63)
    holder: str = Field(max_length=255)
    epoch: int
    expires_at: datetime = Field(sa_type=UTCDateTime)


class FactRow(SQLModel, table=True):
    """Observations as the backends reported them (stored when they change)."""

    __tablename__ = "facts"

    id: int | None = Field(default=None, primary_key=True)
    backend: str = Field(max_length=63)
    backend_name: str = Field(max_length=63)
    job_id: str | None = Field(default=None, max_length=16)
    attempt: int | None = None
    phase: str = Field(max_length=16)
    reason: str = Field(max_length=40)
    observed_at: datetime = Field(sa_type=UTCDateTime)
    payload_json: str = Field(sa_type=sa.Text)


class AdmissionCycleRow(SQLModel, table=True):
    __tablename__ = "admission_cycles"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(sa_type=UTCDateTime)
    leader_epoch: int
    inputs_digest: str = Field(max_length=32)
    record_json: str = Field(sa_type=sa.Text)
    repeats: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    """Idle cycles (no job to decide) after this one folded into its row (revision 0016)."""
    last_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    """When the last of them ran (None: none folded)."""


class ServerSecretRow(SQLModel, table=True):
    """Keys shared by all replicas (e.g. the one that derives per-attempt progress tokens)."""

    __tablename__ = "server_secrets"

    name: str = Field(primary_key=True, max_length=63)
    value: str = Field(max_length=128)


class ExplanationRow(SQLModel, table=True):
    """The latest admission verdicts of a job (overwritten; the events keep the history)."""

    __tablename__ = "explanations"

    job_id: str = Field(primary_key=True, foreign_key="jobs.id", max_length=16)
    at: datetime = Field(sa_type=UTCDateTime)
    payload_json: str = Field(sa_type=sa.Text)


class JobHoldRow(SQLModel, table=True):
    """A user's hold on a queued job (scontrol hold, sbatch --hold): it takes no part in
    admission until released (the row deleted)."""

    __tablename__ = "job_holds"

    job_id: str = Field(primary_key=True, foreign_key="jobs.id", max_length=16)
    held_by: str = Field(max_length=255)
    held_at: datetime = Field(sa_type=UTCDateTime)


class JobRequeueRow(SQLModel, table=True):
    """A request to requeue a job's current attempt (scontrol requeue / requeuehold), kept until
    the admission cycle has stopped that attempt and put the job back in the queue (the row is
    deleted in that transaction), or finds that the job moved on."""

    __tablename__ = "job_requeues"

    job_id: str = Field(primary_key=True, foreign_key="jobs.id", max_length=16)
    attempt: int
    requested_by: str = Field(max_length=255)
    hold: bool = False
    requested_at: datetime = Field(sa_type=UTCDateTime)


class PoolStateRow(SQLModel, table=True):
    """Admin overrides of a pool (drained or not), on top of isthmus.yaml."""

    __tablename__ = "pool_state"

    pool: str = Field(primary_key=True, max_length=63)
    drained: bool
    reason: str = Field(default="", sa_type=sa.Text)
    actor: str = Field(max_length=255)
    updated_at: datetime = Field(sa_type=UTCDateTime)


class CycleDecisionRow(SQLModel, table=True):
    """The decision log: a job's decision in an admission cycle, written when it differs from
    the one last logged for the job (and again after a while; broker/control/decision_log.py).
    Pruned with its cycle after `control.decision_retention`."""

    __tablename__ = "cycle_decisions"
    __table_args__ = (
        sa.Index("ix_cycle_decisions_job", "job_id", "cycle_id"),
        sa.Index("ix_cycle_decisions_cycle", "cycle_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    cycle_id: int
    job_id: str = Field(max_length=16)
    team: str = Field(max_length=63)
    admitted: bool
    reason: str = Field(max_length=40)
    digest: str = Field(max_length=32)
    payload_json: str = Field(sa_type=sa.Text)


class NoticeRow(SQLModel, table=True):
    """The notices outbox: one row per notable job event (broker/domain/notices.py), written in
    the transaction of the event (broker/orchestration/notice_rule.py). `key` is unique, so an
    event gives one notice however often its transaction is retried. The leader's delivery
    pass (broker/control/notices.py) resolves its targets once (`expanded`)."""

    __tablename__ = "notices"
    __table_args__ = (
        sa.UniqueConstraint("key", name="uq_notices_key"),
        sa.Index("ix_notices_expanded", "expanded", "id"),
        sa.Index("ix_notices_job", "job_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(max_length=128)
    kind: str = Field(max_length=24)
    job_id: str | None = Field(default=None, max_length=16)
    event_seq: int | None = None
    team: str = Field(max_length=63)
    at: datetime = Field(sa_type=UTCDateTime)
    details_json: str | None = Field(default=None, sa_type=sa.Text)
    expanded: bool = False


class NoticeDeliveryRow(SQLModel, table=True):
    """One notice to one target (a webhook URL or a mail address): pending until delivered,
    or dead once its attempts are spent (the dead-letter view)."""

    __tablename__ = "notice_deliveries"
    __table_args__ = (
        sa.UniqueConstraint("notice_id", "channel", "target", name="uq_notice_deliveries"),
        sa.Index("ix_notice_deliveries_due", "status", "next_try_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    notice_id: int = Field(foreign_key="notices.id")
    channel: str = Field(max_length=8)
    target: str = Field(max_length=2048)
    status: str = Field(max_length=12)
    attempts: int = 0
    next_try_at: datetime = Field(sa_type=UTCDateTime)
    last_error: str = Field(default="", sa_type=sa.Text)
    delivered_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class AuditRow(SQLModel, table=True):
    """The audit log (broker/store/audit_log.py): one row per state-changing API call or
    admin read of another team's data, chained by hash; append-only (triggers refuse UPDATE
    and DELETE; `isthmus db check` verifies the chain)."""

    __tablename__ = "audit_log"
    __table_args__ = (
        sa.UniqueConstraint("prev_hash", name="uq_audit_log_prev_hash"),
        sa.Index("ix_audit_log_at", "at"),
        sa.Index("ix_audit_log_actor", "actor", "seq"),
        sa.Index("ix_audit_log_target", "target", "seq"),
    )

    seq: int = Field(sa_column=sa.Column(sa.BigInteger(), primary_key=True,
                                         autoincrement=False))
    at: datetime = Field(sa_type=UTCDateTime)
    actor: str = Field(max_length=255)
    actor_team: str | None = Field(default=None, max_length=63)
    actor_admin: bool
    action: str = Field(max_length=40)
    method: str = Field(max_length=8)
    route: str = Field(max_length=255)
    target: str = Field(max_length=255)
    outcome: str = Field(max_length=8)
    status: int
    request_id: str = Field(max_length=64)
    detail_json: str | None = Field(default=None, sa_type=sa.Text)
    prev_hash: str = Field(max_length=64)
    hash: str = Field(max_length=64)


class AuditStagedRow(SQLModel, table=True):
    """Audit records written by the calls they record, waiting to be linked to the chain
    (broker/store/audit_log.py `stage` and `link`): moved, never changed (a trigger refuses
    UPDATE)."""

    __tablename__ = "audit_staged"

    # 64 bits on PostgreSQL (ids are not reused: a sequence); SQLite's rowid is 64 bits already
    id: int | None = Field(default=None, sa_column=sa.Column(
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
        autoincrement=True))
    at: datetime = Field(sa_type=UTCDateTime)
    actor: str = Field(max_length=255)
    actor_team: str | None = Field(default=None, max_length=63)
    actor_admin: bool
    action: str = Field(max_length=40)
    method: str = Field(max_length=8)
    route: str = Field(max_length=255)
    target: str = Field(max_length=255)
    outcome: str = Field(max_length=8)
    status: int
    request_id: str = Field(max_length=64)
    detail_json: str | None = Field(default=None, sa_type=sa.Text)


def _core(model: type[SQLModel]) -> sa.Table:
    """The Core table SQLModel declared for `model`. The tables are declared with SQLModel
    (columns, types and defaults in one place, read by the migrations' tests) and queried with
    SQLAlchemy Core everywhere (the hot paths batch statements and read rows as tuples): these
    handles are the one way the rest of the code names a table."""
    mapper = sa.inspect(model)
    assert mapper is not None
    table = mapper.local_table
    assert isinstance(table, sa.Table)
    return table


JOBS = _core(JobRow)
EVENTS = _core(JobEventRow)
ATTEMPTS = _core(AttemptRow)
FACTS = _core(FactRow)
CYCLES = _core(AdmissionCycleRow)
EXPLANATIONS = _core(ExplanationRow)
DECISIONS = _core(CycleDecisionRow)
LEASES = _core(LeaderLeaseRow)
LEDGER_ENTRIES = _core(LedgerEntryRow)
LEDGER_DAILY = _core(LedgerDailyRow)
NOTICES = _core(NoticeRow)
NOTICE_DELIVERIES = _core(NoticeDeliveryRow)
POOL_STATE = _core(PoolStateRow)
QUOTA_USAGE = _core(QuotaUsageRow)
SERVER_SECRETS = _core(ServerSecretRow)
JOB_HOLDS = _core(JobHoldRow)
JOB_REQUEUES = _core(JobRequeueRow)
AUDIT_LOG = _core(AuditRow)
AUDIT_STAGED = _core(AuditStagedRow)
