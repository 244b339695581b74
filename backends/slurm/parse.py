"""Parsers shared by both transports: squeue/sinfo JSON (the CLI and slurmrestd print the same
OpenAPI documents), sacct parsable text, slurmdbd JSON and `scontrol show topology`."""

from __future__ import annotations

import pwd
import re
from collections.abc import Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any

from backends.slurm.records import NodeEvent, NodeRecord, SlurmJob, Switch
from broker.domain import slurm_time
from broker.domain.hostlist import expand

EVENT_FIELDS = ("NodeName", "TimeStart", "TimeEnd", "State", "Reason")
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Reason", "NodeList", "Submit",
                "Start", "End", "Partition", "ReqTRES", "NNodes", "User", "Timelimit")
# sacct -s: every state, so that --name finds jobs that never ran (cancelled while pending)
SACCT_STATES = "PD,R,CA,CD,F,TO,NF,PR,OOM,BF,DL,RQ,RS,S,RV"
_GRES = re.compile(r"^gpu(?::([^:(]+))?:(\d+)")
_TRES_GPU = re.compile(r"gres/gpu(?::[^=,]+)?=(\d+)")
_TRES_GPU_TOTAL = re.compile(r"gres/gpu=(\d+)")


def number(value: Any) -> int | None:
    """An OpenAPI number: 3, None, or {"set": true, "infinite": false, "number": 3}."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):  # NaN, infinity, text
        return None
    return n if -(2**64) < n < 2**64 else None  # Slurm's fields are at most 64-bit


def epoch(value: Any) -> datetime | None:
    """A Unix time; None when absent, or beyond what a date can hold (no evidence)."""
    seconds = number(value)
    if not seconds:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def base_state(value: Any) -> tuple[str, frozenset[str]]:
    """'RUNNING' or ['RUNNING', 'COMPLETING'] -> ('RUNNING', {...}); flags win for the
    transitional states newer versions report as flags."""
    if isinstance(value, list):
        items = [str(v).upper() for v in value]
        if not items:
            return "", frozenset()
        flags = frozenset(items[1:])
        for transitional in ("COMPLETING", "CONFIGURING"):
            if transitional in flags:
                return transitional, flags
        return items[0], flags
    return str(value or "").upper(), frozenset()


def wait_status(raw: int | None) -> tuple[int | None, int | None]:
    """squeue's v0.0.38 exit_code is a wait(2) status: 768 -> exit 3; 9 -> signal 9."""
    if raw is None:
        return None, None
    if raw & 0x7F:
        return None, raw & 0x7F
    return (raw >> 8) & 0xFF, None


def exit_object(value: Any) -> tuple[int | None, int | None]:
    """v0.0.40+ {"status": [...], "return_code": {...}, "signal": {"id": {...}}}."""
    if not isinstance(value, Mapping):
        return wait_status(number(value))
    sig = value.get("signal")
    signal = number(sig.get("id", sig.get("signal_id"))) if isinstance(sig, Mapping) else None
    return number(value.get("return_code")), signal or None


def gpus_in_tres(tres: str) -> int:
    total = _TRES_GPU_TOTAL.search(tres or "")
    if total:
        return int(total.group(1))
    return sum(int(m) for m in _TRES_GPU.findall(tres or ""))


def squeue_job(d: Mapping[str, Any]) -> SlurmJob:
    state, flags = base_state(d.get("job_state"))
    exit_code, signal = exit_object(d.get("exit_code"))
    if state in ("PENDING", "RUNNING", "CONFIGURING"):
        exit_code, signal = None, None  # not ended: exit_code is a placeholder 0
    return SlurmJob(
        job_id=str(d.get("job_id")),
        name=str(d.get("name") or ""),
        state=state,
        reason=str(d.get("state_reason") or ""),
        exit_code=exit_code,
        signal=signal,
        nodes=expand(str(d.get("nodes") or "")),
        partition=str(d.get("partition") or ""),
        gpus=gpus_in_tres(str(d.get("tres_req_str") or "")),
        node_count=number(d.get("node_count")) or 0,
        comment=str(d.get("comment") or ""),
        user=str(d.get("user_name") or ""),
        submitted_at=epoch(d.get("submit_time")),
        started_at=epoch(d.get("start_time")),
        ended_at=epoch(d.get("end_time")) if state not in ("PENDING", "RUNNING") else None,
        time_limit_s=(lambda m: m * 60 if m is not None else None)(number(d.get("time_limit"))),
        source="queue",
        flags=flags,
    )


def _gres(text: str) -> tuple[str, int]:
    best_type, count = "", 0
    for part in (text or "").split(","):
        m = _GRES.match(part.strip())
        if m:
            best_type = best_type or (m.group(1) or "")
            count += int(m.group(2))
    return best_type, count


def sinfo_node(d: Mapping[str, Any]) -> NodeRecord:
    raw_state = d.get("state")
    flags = {str(f).upper() for f in d.get("state_flags") or []}
    if isinstance(raw_state, list):  # v0.0.40+: ["IDLE", "DRAIN"]
        items = [str(s).upper() for s in raw_state]
        state = items[0].lower() if items else ""
        flags |= set(items[1:])
    else:
        state = str(raw_state or "").lower()
    gpu_type, gpus = _gres(str(d.get("gres") or ""))
    _, used = _gres(str(d.get("gres_used") or ""))
    features = d.get("active_features") or d.get("features") or ""
    if isinstance(features, list):
        feature_list = tuple(str(f) for f in features)
    else:
        feature_list = tuple(f for f in str(features).split(",") if f)
    return NodeRecord(
        name=str(d.get("name")),
        partitions=tuple(str(p) for p in d.get("partitions") or ()),
        state=state,
        flags=frozenset(flags),
        reason=str(d.get("reason") or ""),
        gpu_type=gpu_type,
        gpus=gpus,
        gpus_used=used,
        cpus=number(d.get("cpus")) or 0,
        cpus_used=number(d.get("alloc_cpus")) or 0,
        memory_mb=number(d.get("real_memory")) or 0,
        memory_used_mb=number(d.get("alloc_memory")) or 0,
        features=feature_list,
    )


def topology(text: str) -> list[Switch]:
    """Parse `scontrol show topology` lines (SwitchName=... Level=... Nodes=... Switches=...)."""
    switches = []
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "SwitchName" not in fields:
            continue
        switches.append(Switch(
            name=fields["SwitchName"],
            level=int(fields.get("Level", "0") or 0),
            nodes=expand(fields.get("Nodes", "")),
            switches=expand(fields.get("Switches", "")),
        ))
    return switches


def _local_time(text: str) -> datetime | None:
    if not text or text in ("Unknown", "None"):
        return None
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except ValueError:
        return None


def user_name(uid_or_name: str) -> str:
    if uid_or_name.isdigit():
        try:
            return pwd.getpwuid(int(uid_or_name)).pw_name
        except KeyError:
            return uid_or_name
    return uid_or_name


def _limit_seconds(text: str) -> int | None:
    """sacct's Timelimit in seconds; None for UNLIMITED, Partition_Limit or anything else."""
    try:
        return slurm_time.parse(text or "")
    except ValueError:
        return None


STEP_FIELDS = ("JobID", "State")
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED",
                           "RESIZING", "SUSPENDED"})


def sacct_steps(text: str) -> dict[str, tuple[str, ...]]:
    """Rows of `sacct -P -n -j <ids> -o JobID,State` (steps included) -> job id -> its step
    names, for jobs whose allocation row is in a final state (see Transport.steps)."""
    steps: dict[str, list[str]] = {}
    ended: set[str] = set()
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) < len(STEP_FIELDS):
            continue
        job_id, _, step = cols[0].strip().partition(".")
        steps.setdefault(job_id, [])
        if step:
            steps[job_id].append(step)
        elif cols[1].strip().split(" ")[0].upper() not in ACTIVE_STATES:
            ended.add(job_id)
    return {j: tuple(s) for j, s in steps.items() if j in ended}


def db_state(d: Mapping[str, Any]) -> tuple[str, str]:
    """(base state, reason) of a job of slurmdbd's JSON: {"current": ..., "reason": ...} or,
    in some versions, the bare state."""
    state_obj = d.get("state") or {}
    if not isinstance(state_obj, Mapping):
        return base_state(state_obj)[0], ""
    return base_state(state_obj.get("current"))[0], str(state_obj.get("reason") or "")


def db_steps(d: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Step names of a job of slurmdbd's JSON ("batch", "extern", "0", ...), or None while its
    end is not recorded (its step list may still be incomplete)."""
    state, _ = db_state(d)
    if state in ACTIVE_STATES or not state:
        return None
    names = []
    for step in d.get("steps") or ():
        ident = (step.get("step") or {}).get("id") if isinstance(step, Mapping) else None
        if ident is not None:
            names.append(str(ident).rsplit(".", 1)[-1])  # "1234.batch" in some versions
    return tuple(names)


def sacct_text(text: str) -> list[SlurmJob]:
    """Rows of `sacct -P -n -X -o <SACCT_FIELDS>`; exit codes here are right on 22.05."""
    jobs = []
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) < len(SACCT_FIELDS):
            continue
        row = dict(zip(SACCT_FIELDS, cols, strict=False))
        state, _, by = row["State"].partition(" by ")
        code, _, sig = row["ExitCode"].partition(":")
        exit_code = int(code) if code.isdigit() else None
        signal = int(sig) if sig.isdigit() and int(sig) else None
        state = state.strip().upper()
        if state in ("PENDING", "RUNNING", "CONFIGURING"):
            exit_code = signal = None
        jobs.append(SlurmJob(
            job_id=row["JobID"],
            name=row["JobName"],
            state=state,
            reason=row["Reason"],
            exit_code=exit_code,
            signal=signal,
            nodes=expand(row["NodeList"]),
            partition=row["Partition"],
            gpus=gpus_in_tres(row["ReqTRES"]),
            node_count=int(row["NNodes"]) if row["NNodes"].isdigit() else 0,
            user=row["User"],
            cancelled_by=user_name(by.strip()) if by.strip() else None,
            submitted_at=_local_time(row["Submit"]),
            started_at=_local_time(row["Start"]),
            ended_at=_local_time(row["End"]),
            time_limit_s=_limit_seconds(row["Timelimit"]),
            source="accounting",
        ))
    return jobs


def db_job(d: Mapping[str, Any], *, exit_code_reliable: bool) -> SlurmJob:
    """A job of slurmdbd's JSON (slurmrestd /slurmdb/.../jobs, or sacct --json)."""
    state, reason = db_state(d)
    exit_obj = d.get("exit_code") or {}
    exit_code, signal = exit_object(exit_obj)
    if not exit_code_reliable:
        exit_code = None  # 22.05 reports return_code 0 for a job that exited 3
    times = d.get("time") or {}
    gpus = 0
    tres = d.get("tres") or {}
    for item in tres.get("requested") or () if isinstance(tres, Mapping) else ():
        if item.get("type") == "gres" and str(item.get("name", "")).startswith("gpu"):
            gpus += number(item.get("count")) or 0
    return SlurmJob(
        job_id=str(d.get("job_id")),
        name=str(d.get("name") or ""),
        state=state,
        reason=reason,
        exit_code=exit_code,
        signal=signal,
        nodes=expand(str(d.get("nodes") or "")),
        partition=str(d.get("partition") or ""),
        gpus=gpus,
        node_count=number(d.get("allocation_nodes")) or 0,
        user=str(d.get("user") or ""),
        submitted_at=epoch(times.get("submission")),
        started_at=epoch(times.get("start")),
        ended_at=epoch(times.get("end")),
        source="accounting",
    )


def node_state_text(text: str) -> tuple[str, frozenset[str]]:
    """'DOWN*' -> ('down', {NOT_RESPONDING}); 'MIXED+DRAIN' -> ('mixed', {DRAIN})."""
    parts = [p for p in text.strip().split("+") if p]
    if not parts:
        return "", frozenset()
    flags = {p.rstrip("*~#!%$@^-").upper() for p in parts[1:]}
    if any(p.endswith("*") for p in parts):
        flags.add("NOT_RESPONDING")
    return parts[0].rstrip("*~#!%$@^-").lower(), frozenset(flags)


def sacctmgr_events(text: str, *, tz: tzinfo | None = None) -> list[NodeEvent]:
    """Rows of `sacctmgr -P -n show event Format=<EVENT_FIELDS>`. Times may be epoch seconds
    (what the CLI transport asks for, with SLURM_TIME_FORMAT=%s), ISO with an offset, or
    sacctmgr's default: ISO local time *of the sacctmgr process*, read in ``tz`` (default: this
    process's local zone; the CLI transport runs sacctmgr with TZ=UTC and passes UTC).
    "Unknown" (or empty) is an event not over, or not yet recorded as over."""

    def when(value: str) -> datetime | None:
        value = value.strip()
        if not value or value in ("Unknown", "None"):
            return None
        if value.isdigit():
            return datetime.fromtimestamp(int(value), tz=UTC) if int(value) else None
        try:
            at = datetime.fromisoformat(value)
        except ValueError:
            return None
        if at.tzinfo is None:
            at = at.replace(tzinfo=tz) if tz is not None else at.astimezone()
        return at.astimezone(UTC)

    events = []
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) < len(EVENT_FIELDS) or not cols[0]:
            continue
        row = dict(zip(EVENT_FIELDS, cols, strict=False))
        state, flags = node_state_text(row["State"])
        events.append(NodeEvent(node=row["NodeName"], state=state, flags=flags,
                                reason=row["Reason"], start=when(row["TimeStart"]),
                                end=when(row["TimeEnd"])))
    return events
