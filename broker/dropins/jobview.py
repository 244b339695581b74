"""How Isthmus jobs look to squeue/sacct users: state codes, names, times and host lists.

| lifecycle state | isqueue (ST) | isacct (State) |
|---|---|---|
| SUBMITTED, VALIDATING, QUEUED, ADMITTED, PREPARING, RETRYING | PD | PENDING |
| RUNNING | R | RUNNING |
| SUCCEEDED | CD | COMPLETED |
| FAILED (timeout seen by the backend) | TO | TIMEOUT |
| FAILED (preempted) | PR | PREEMPTED |
| FAILED (the backend's NODE_FAIL) | NF | NODE_FAIL |
| FAILED (OUT_OF_MEMORY, OOMKilled) | OOM | OUT_OF_MEMORY |
| FAILED, REJECTED | F | FAILED |
| CANCELLED | CA | CANCELLED |

The lifecycle has no completing or suspended state, so CG and S are never shown. A waiting
job's NODELIST(REASON) is its Isthmus reason, e.g. ``(QuotaExhausted)``.
"""

from __future__ import annotations

import json
import pwd
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from broker.domain.hostlist import compress as compress  # re-exported: isqueue, isacct
from broker.domain.start_window import likely_of
from broker.domain.units import parse_duration
from broker.sbatch.compat import ANNOTATION

PENDING_STATES = ("SUBMITTED", "VALIDATING", "QUEUED", "ADMITTED", "PREPARING", "RETRYING")
ACTIVE_STATES = (*PENDING_STATES, "RUNNING")
CODES = {"PD": "PENDING", "R": "RUNNING", "CD": "COMPLETED", "F": "FAILED", "CA": "CANCELLED",
         "TO": "TIMEOUT", "PR": "PREEMPTED", "CG": "COMPLETING", "S": "SUSPENDED",
         "NF": "NODE_FAIL", "OOM": "OUT_OF_MEMORY", "RQ": "REQUEUED"}
NAMES = {v: k for k, v in CODES.items()}


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    at = datetime.fromisoformat(text)
    return at if at.tzinfo else at.replace(tzinfo=UTC)


@dataclass(frozen=True)
class JobView:
    id: str
    name: str
    user: str
    account: str  # the team
    state: str  # lifecycle state
    reason: str
    partition: str
    qos: str
    nodes: tuple[str, ...]
    num_nodes: int
    gpus_per_node: int
    cpus: int
    time_limit_s: int
    submitted: datetime
    start: datetime | None
    end: datetime | None
    exit_code: int | None
    signal: int | None
    failure: str | None
    raw_state: str | None
    array_job_id: str | None
    array_task_id: int | None
    estimated_start: datetime | None = None
    """The broker's ETA for a waiting job (its last admission cycle's estimate), else None."""
    start_window: str | None = None
    """Where that start is likely to fall, as text ('likely ... (80%)'), else None."""
    number: int | None = None
    """The numeric id (None for a job stored before numbers): what Slurm's tools see."""
    array_limit: int | None = None
    """An array's %N (running tasks at most)."""
    stdout: str | None = None
    """The script's --output pattern (entrypoint.batch.output) as given; `paths` expands it."""
    stderr: str | None = None
    pending_tasks: str | None = None
    """Set on the one line squeue shows for an array's pending tasks: their indices as
    ``0-5%2`` (`collapse_pending`)."""
    cancelled_by: str | None = None
    """Who cancelled the job (a user's name, or ``system:...``: the broker), if it was."""

    @property
    def raw_id(self) -> str:
        """sacct's JobIDRaw: the job's own number (the Isthmus id for an unnumbered job)."""
        return str(self.number) if self.number is not None else self.id

    @property
    def long_state(self) -> str:
        s = self.state
        if s in PENDING_STATES:
            return "PENDING"
        if s == "FAILED" and (self.raw_state or "").upper().startswith("TIMEOUT"):
            return "TIMEOUT"
        if s == "FAILED" and self.failure == "Preempted":
            return "PREEMPTED"
        raw = (self.raw_state or "").upper()
        if s == "FAILED" and raw.startswith("NODE_FAIL"):
            return "NODE_FAIL"
        if s == "FAILED" and (raw.startswith("OUT_OF_MEMORY") or raw == "OOMKILLED"):
            return "OUT_OF_MEMORY"
        return {"RUNNING": "RUNNING", "SUCCEEDED": "COMPLETED", "CANCELLED": "CANCELLED",
                "FAILED": "FAILED", "REJECTED": "FAILED"}.get(s, s)

    @property
    def accounted_state(self) -> str:
        """sacct's State: ``CANCELLED by UID`` for a cancelled job, as Slurm writes it (the
        uid of the user of that name on this host; 0 when the broker cancelled it, as for
        slurmctld's own cancels; 4294967294 for a name this host does not know)."""
        if self.long_state != "CANCELLED" or self.cancelled_by is None:
            return self.long_state
        return f"CANCELLED by {uid_of(self.cancelled_by)}"

    @property
    def code(self) -> str:
        return NAMES[self.long_state]

    def elapsed_s(self, now: datetime) -> int:
        if self.start is None:
            return 0
        return max(0, int(((self.end or now) - self.start).total_seconds()))

    @property
    def exit_text(self) -> str:
        """sacct's ExitCode "code:signal"."""
        if self.state == "SUCCEEDED":
            return f"{self.exit_code or 0}:{self.signal or 0}"
        if self.exit_code is None and self.signal is None:
            return "0:0" if self.state not in ("FAILED", "REJECTED") else "1:0"
        return f"{self.exit_code or 0}:{self.signal or 0}"

    @property
    def display_id(self) -> str:
        """squeue's and sacct's JobID: ``ARRAY_TASK`` for an array task, else the number."""
        if self.array_job_id is not None and self.pending_tasks is not None:
            return f"{self.array_job_id}_[{self.pending_tasks}]"
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.raw_id

    def matches_id(self, wanted: str) -> bool:
        """Slurm's -j/ids: the job's own id or number, ``ARRAY_TASK``, or the array's id
        (every task of it: an array's id is its first task's number, as with Slurm)."""
        return wanted in (self.id, self.raw_id, self.display_id) or wanted == self.array_job_id


NOBODY = 4294967294
"""The uid Slurm writes for a user it cannot name (its NO_VAL)."""


def uid_of(name: str) -> int:
    """The uid of user `name` on this host: 0 for the broker itself (``system:...``),
    NOBODY for a name unknown here."""
    if name.startswith("system:"):
        return 0
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return NOBODY


def view(item: dict[str, Any]) -> JobView:
    """A JobView from one item of ``GET /v1/hpc/jobs``."""
    spec = item.get("spec") or {}
    gang = spec.get("gang") or {}
    run = item.get("run") or {}
    request: dict[str, Any] = {}
    annotation = (spec.get("annotations") or {}).get(ANNOTATION)
    if annotation:
        try:
            request = json.loads(annotation)
        except ValueError:
            request = {}
    sbatch: dict[str, Any] = request.get("sbatch") or {}
    array = (spec.get("scheduling") or {}).get("array") or {}
    batch = (spec.get("entrypoint") or {}).get("batch") or {}
    # An array's id as the user knows it: its number (its first task's); an array stored
    # before numbers, or made through the API with another id, keeps that id.
    array_id = item.get("array_number")
    array_id = array.get("id") if array_id is None else array_id
    partition = (request.get("partition") or sbatch.get("partition") or item.get("partition")
                 or run.get("pool")
                 or ",".join(spec.get("flavors") or []))
    return JobView(
        id=item["id"], name=sbatch.get("job_name") or item["name"], user=item["submitted_by"],
        account=item["team"], state=item["state"], reason=item["reason"], partition=partition,
        qos=item.get("priority", ""), nodes=tuple(run.get("nodes") or ()),
        num_nodes=int(gang.get("replicas", 1)), gpus_per_node=int(gang.get("gpus_per_replica", 0)),
        cpus=int(gang.get("cpus_per_replica") or 1) * int(gang.get("replicas", 1)),
        time_limit_s=_limit(spec.get("max_runtime")),
        submitted=_parse_time(item["created_at"]) or datetime.now(UTC),
        start=_parse_time(run.get("started_at")), end=_parse_time(run.get("ended_at")),
        exit_code=run.get("exit_code"), signal=run.get("signal"), failure=run.get("failure"),
        raw_state=run.get("raw_state"),
        array_job_id=None if array_id is None else str(array_id),
        array_task_id=array.get("index"),
        estimated_start=_expected_start(item, spec),
        start_window=_start_window(item, spec),
        number=item.get("number"), array_limit=array.get("limit"),
        stdout=batch.get("output"), stderr=batch.get("error"),
        cancelled_by=item.get("cancelled_by"),
    )


def _expected_start(item: dict[str, Any], spec: dict[str, Any]) -> datetime | None:
    """The broker's estimate, and never before the job's --begin time (a job held for its
    begin time has no estimate: squeue --start shows the begin time then, and so does this)."""
    estimate = _parse_time((item.get("wait") or {}).get("estimated_start"))
    begin = _parse_time((spec.get("scheduling") or {}).get("begin_at"))
    if begin is None or item.get("state") not in ("SUBMITTED", "VALIDATING", "QUEUED"):
        return estimate
    return begin if estimate is None or begin > estimate else estimate


def _start_window(item: dict[str, Any], spec: dict[str, Any]) -> str | None:
    """The estimate's window, unless a --begin time later than the estimate replaces it."""
    if _expected_start(item, spec) != _parse_time((item.get("wait") or {}).get("estimated_start")):
        return None
    return likely_of((item.get("wait") or {}).get("start_window"))


def oldest_first(jobs: list[JobView]) -> list[JobView]:
    """The listing (newest first) in submit order, by number where jobs have one: an array's
    tasks in index order, as Slurm lists job ids."""
    ordered = list(reversed(jobs))
    return sorted(ordered, key=lambda j: j.number if j.number is not None else -1)


def expand_path(pattern: str | None, job: JobView) -> str:
    """An output pattern as the job's files are named: %j, %x, %A, %a, %u as Slurm expands
    them (Isthmus's number for %j; the other patterns stay); ``(null)`` without one."""
    if not pattern:
        return "(null)"
    values = {"%j": job.raw_id, "%x": job.name, "%u": job.user, "%%": "%",
              "%A": job.array_job_id or job.raw_id,
              "%a": str(job.array_task_id) if job.array_task_id is not None else "4294967294"}
    return re.sub(r"%[jxuAa%]", lambda m: values[m.group(0)], pattern)


def index_ranges(indices: list[int]) -> str:
    """Array indices as Slurm writes them: ``0-5``, ``1,3,7-9``."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(set(indices)):
        if run and i != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(i)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def collapse_pending(jobs: list[JobView]) -> list[JobView]:
    """squeue without -r: an array's pending tasks are one line ``ARRAY_[0-5%2]`` in the
    place of its first; running and ended tasks stay one line each."""
    groups: dict[str, list[JobView]] = {}
    for job in jobs:
        if job.array_job_id is not None and job.array_task_id is not None \
                and job.long_state == "PENDING":
            groups.setdefault(job.array_job_id, []).append(job)
    out: list[JobView] = []
    for job in jobs:
        group = groups.get(job.array_job_id or "") if job.long_state == "PENDING" else None
        if not group or job.array_task_id is None:
            out.append(job)
        elif job is group[0]:
            shown = index_ranges([j.array_task_id for j in group if j.array_task_id is not None])
            limit = f"%{job.array_limit}" if job.array_limit else ""
            out.append(replace(job, pending_tasks=shown + limit))
    return out


def _limit(value: Any) -> int:
    try:
        return parse_duration(value) if value is not None else 0
    except ValueError:
        return 0


def timestamp(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S") if at else "Unknown"
