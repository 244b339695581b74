"""Slurm CLI transport, for a broker on a login node: sbatch, squeue, sinfo, sacct, scontrol.

Every command is an argument list with a timeout. A slurmctld that cannot be reached (or a
missing command) raises BackendUnavailable; refusals of a submission raise SubmitRefused.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from backends.base import BackendUnavailable
from backends.slurm import parse
from backends.slurm.owner_policy import OwnerPolicy, OwnerRefused, cluster_accounts
from backends.slurm.records import BatchJob, NodeEvent, NodeRecord, SlurmJob, Switch
from backends.slurm.transport import SubmitRefused
from backends.slurm.versions import Dialect, dialect_for, parse_release
from broker.logs import get_logger

log = get_logger(__name__)
_UNREACHABLE = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Slurm backup controller in standby mode",
    "slurm_load_jobs error",
    "slurm_load_node error",
    "Zero Bytes were transmitted or received",
    "Unable to establish connection",
    "slurmdbd: Connection refused",
    "Problem talking to the database",
)
JOB_ENV_KEYS = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "SLURM_CONF")
_UNKNOWN_JOB = ("Invalid job id specified", "Job/step already completing or completed")


JOB_UMASK = "0077"


def _identity(user: str, policy: OwnerPolicy) -> tuple[dict[str, Any], str]:
    """subprocess arguments that run a command as `user` (uid, gid, its groups), and its home.
    Only for a user the owner policy allows (never root, SlurmUser or a system account): sbatch
    runs with this host's uid, so this host's account is the one checked."""
    try:
        policy.check_name(user)
        pw = pwd.getpwnam(user)
        problem = policy.uid_problem(user, pw.pw_uid)
    except OwnerRefused as exc:
        raise SubmitRefused(str(exc)) from None
    except KeyError:
        raise SubmitRefused(f"no Unix user '{user}' to submit the job as (backend setting "
                            "unix_users maps API users to Unix users)") from None
    if problem:
        raise SubmitRefused(problem)
    groups = os.getgrouplist(user, pw.pw_gid)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": groups}, pw.pw_dir


class SlurmCommandError(RuntimeError):
    """A Slurm command failed for a reason other than an unreachable controller."""


class CliTransport:
    kind = "cli"
    serves_node_events = True  # sacctmgr show event

    def __init__(
        self,
        *,
        slurm_conf: str | None = None,
        bin_dir: str | None = None,
        timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
        allow_untested_version: bool = False,
        owner_policy: OwnerPolicy | None = None,
    ) -> None:
        self.timeout = timeout
        self.bin_dir = bin_dir
        self.allow_untested = allow_untested_version
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("SLURM_", "SBATCH_", "SQUEUE_", "SACCT_", "SALLOC_"))}
        base.update(env or {})
        if slurm_conf:
            base["SLURM_CONF"] = slurm_conf
        self.env = base
        self._dialect: Dialect | None = None
        self.owner_policy = owner_policy or OwnerPolicy()
        self._cluster_accounts_read = False

    # -- plumbing -----------------------------------------------------------------------------

    def _cmd(self, name: str) -> str:
        return str(Path(self.bin_dir) / name) if self.bin_dir else name

    def run(self, args: Sequence[str], *, input: str | None = None, unknown_ok: bool = False,
            env: Mapping[str, str] | None = None, user: int | None = None,
            group: int | None = None,
            extra_groups: list[int] | None = None) -> subprocess.CompletedProcess[str]:
        argv = [self._cmd(args[0]), *args[1:]]
        try:
            proc = subprocess.run(  # noqa: S603 - an argument list, never a shell
                argv, input=input, capture_output=True, text=True,
                timeout=self.timeout, env=dict(env or self.env), check=False,
                user=user, group=group, extra_groups=extra_groups,
            )
        except FileNotFoundError as exc:
            raise BackendUnavailable(f"{args[0]} not found: is Slurm installed here?") from exc
        except subprocess.TimeoutExpired as exc:
            raise BackendUnavailable(f"{args[0]} timed out after {self.timeout:.0f}s") from exc
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).strip()
            if any(marker in err for marker in _UNREACHABLE):
                raise BackendUnavailable(f"{args[0]}: {err}")
            if unknown_ok and any(marker in err for marker in _UNKNOWN_JOB):
                return proc
            raise SlurmCommandError(f"{' '.join(args[:3])} exited {proc.returncode}: {err}")
        return proc

    def _json(self, args: Sequence[str]) -> dict[str, Any]:
        out = self.run(args).stdout
        try:
            data = json.loads(out)
        except json.JSONDecodeError as exc:
            raise SlurmCommandError(f"{args[0]} printed no JSON: {out[:200]!r}") from exc
        if not isinstance(data, dict):
            raise SlurmCommandError(f"{args[0]} printed unexpected JSON")
        errors = [e for e in data.get("errors") or () if isinstance(e, dict)]
        if errors:
            # `squeue --json` exits 0 with an empty job list and an `errors` entry when
            # slurmctld is down (seen on 22.05): that is no data, not "no jobs".
            text = "; ".join(
                f"{e.get('source', '')}: {e.get('description') or e.get('error')}" for e in errors
            )
            raise BackendUnavailable(f"{args[0]} could not load its data: {text}")
        return data

    # -- transport ----------------------------------------------------------------------------

    def dialect(self) -> Dialect:
        if self._dialect is None:
            text = self.run(["scontrol", "--version"]).stdout
            self._dialect = dialect_for(parse_release(text), allow_untested=self.allow_untested)
        return self._dialect

    def nodes(self) -> list[NodeRecord]:
        data = self._json(["sinfo", "--json"])
        return [parse.sinfo_node(n) for n in data.get("nodes") or ()]

    def topology(self) -> list[Switch]:
        proc = self.run(["scontrol", "show", "topology"])
        return parse.topology(proc.stdout)

    def jobs(self) -> list[SlurmJob]:
        data = self._json(["squeue", "--json"])
        return [parse.squeue_job(j) for j in data.get("jobs") or ()]

    def find(self, name: str) -> list[SlurmJob]:
        out = self.run(["squeue", "-h", "-t", "all", "--name", name, "-o", "%i"]).stdout
        ids = [line.strip() for line in out.splitlines() if line.strip()]
        if not ids:
            return []
        data = self._json(["squeue", "--json", "--jobs", ",".join(ids)])
        return [r for r in (parse.squeue_job(j) for j in data.get("jobs") or ())
                if r.name == name]

    def accounting(self, *, names: Sequence[str] = (), job_ids: Sequence[str] = (),
                   since: datetime) -> list[SlurmJob]:
        if not names and not job_ids:
            return []
        base = ["sacct", "-P", "-n", "-X", "-o", ",".join(parse.SACCT_FIELDS)]
        rows: list[SlurmJob] = []
        if job_ids:
            rows += parse.sacct_text(self.run([*base, "-j", ",".join(job_ids)]).stdout)
        if names:
            start = since.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
            args = [*base, "-S", start, "-E", "now", "-s", parse.SACCT_STATES,
                    "--name", ",".join(names)]
            rows += parse.sacct_text(self.run(args).stdout)
        return rows

    def node_events(self, nodes: Sequence[str], *, since: datetime) -> list[NodeEvent]:
        if not nodes:
            return []
        # sacctmgr reads and prints local times, of its own TZ (which the configured env may
        # set): run it in UTC and have it print epoch seconds, so no zone is ever guessed
        start = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
        env = {**self.env, "TZ": "UTC", "SLURM_TIME_FORMAT": "%s"}
        try:
            proc = self.run(["sacctmgr", "-P", "-n", "show", "event", "Event=Node",
                             f"Nodes={','.join(nodes)}", f"Start={start}", "End=now",
                             f"Format={','.join(parse.EVENT_FIELDS)}"], env=env)
        except SlurmCommandError as exc:
            # extra evidence only (e.g. refused by PrivateData): never block observing jobs
            log.warning("node events unavailable, judging failed jobs without them: %s", exc)
            return []
        return parse.sacctmgr_events(proc.stdout, tz=UTC)

    def steps(self, job_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        if not job_ids:
            return {}
        try:
            proc = self.run(["sacct", "-P", "-n", "-j", ",".join(job_ids),
                             "-o", ",".join(parse.STEP_FIELDS)])
        except SlurmCommandError as exc:
            log.warning("job steps unavailable, judging failed jobs without them: %s", exc)
            return {}
        return parse.sacct_steps(proc.stdout)

    def submit(self, job: BatchJob, *, as_user: str | None = None) -> str:
        env = self.job_env()
        # the output file is created before the script runs: private from the start
        env["SLURM_UMASK"] = JOB_UMASK
        ids: dict[str, Any] = {}
        spool = Path(job.output).parent
        if as_user is not None:
            ids, home = _identity(as_user, self._owner_policy())
            env.update({"USER": as_user, "LOGNAME": as_user, "HOME": home})
            if not spool.exists():  # shared by every owner, like /tmp
                spool.mkdir(parents=True, exist_ok=True)
                spool.chmod(0o1777)
        else:
            spool.mkdir(parents=True, exist_ok=True)
        try:
            proc = self.run(["sbatch", "--parsable"], input=job.script, env=env, **ids)
        except SlurmCommandError as exc:
            raise SubmitRefused(str(exc)) from exc
        job_id = proc.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmCommandError(f"sbatch printed no job id: {proc.stdout!r}")
        return job_id

    def _owner_policy(self) -> OwnerPolicy:
        """The owner policy, once with the cluster's SlurmUser and SlurmdUser added (read from
        `scontrol show config`; 'slurm' and root are denied even when it cannot be read)."""
        if not self._cluster_accounts_read:
            try:
                text = self.run(["scontrol", "show", "config"]).stdout
            except SlurmCommandError as exc:
                log.warning("SlurmUser unknown (scontrol show config: %s); denying 'slurm'",
                            exc)
                return self.owner_policy
            self.owner_policy = self.owner_policy.with_cluster_accounts(*cluster_accounts(text))
            self._cluster_accounts_read = True
        return self.owner_policy

    def job_env(self) -> dict[str, str]:
        """sbatch exports its environment to the job: give it only what a job needs, never
        the broker's own variables (database URLs, tokens)."""
        return {k: v for k, v in self.env.items() if k in JOB_ENV_KEYS}

    def signal(self, job_id: str, signal: str) -> bool:
        proc = self.run(["scancel", f"--signal={signal}", "--batch", job_id], unknown_ok=True)
        return proc.returncode == 0

    def signal_steps(self, job_id: str, signal: str) -> bool:
        proc = self.run(["scancel", f"--signal={signal}", job_id], unknown_ok=True)
        return proc.returncode == 0

    def signal_full(self, job_id: str, signal: str) -> bool:
        proc = self.run(["scancel", f"--signal={signal}", "--full", job_id], unknown_ok=True)
        return proc.returncode == 0

    def cancel(self, job_id: str) -> bool:
        proc = self.run(["scancel", job_id], unknown_ok=True)
        return proc.returncode == 0

    def close(self) -> None:
        return None
