"""slurmrestd transport (HTTP + JWT), for a broker that is not on a login node.

The OpenAPI version is read from ``/openapi/v3`` (the newest /slurm/<v>/ this adapter knows)
unless the ``rest_version`` setting forces one. slurmrestd ignores #SBATCH lines, so submit
sends every option as a field; v0.0.38 has no field for a node list or a switch count, so rack
placement there needs nodes that carry their rack's name as a feature (``rack_features``),
and the same features stand in for `scontrol show topology`, which has no REST endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx

from backends.base import BackendUnavailable, Unsupported
from backends.slurm import parse
from backends.slurm.owner_policy import OwnerPolicy
from backends.slurm.owner_tokens import OwnerTokenError, OwnerTokens
from backends.slurm.records import BatchJob, NodeEvent, NodeRecord, SlurmJob, Switch
from backends.slurm.script import gpu_count, per_task_gpus
from backends.slurm.transport import SubmitRefused
from backends.slurm.versions import DIALECTS, Dialect, dialect_for_openapi
from broker.logs import get_logger

log = get_logger(__name__)
DB_STATES = "CA,CD,F,TO,NF,PR,OOM,BF,DL,R,PD"
JOB_PATH = "/usr/local/bin:/usr/bin:/bin"
JOB_UMASK = "0077"
_HELD = 2042  # "Job is in held state, pending scheduler release": a warning, the job exists
_NOTHING_FOUND = 9003
_INVALID_JOB = 2017
NATIVE_FIELDS = {"qos": "qos", "reservation": "reservation", "licenses": "licenses",
                 "wckey": "wckey", "nice": "nice"}
"""A job's native sbatch options (native.slurm.options) as slurmrestd's job fields (the same
name in every version this adapter speaks); --constraint goes into `constraints`."""


class RestTransport:
    kind = "rest"
    serves_node_events = False  # see node_events

    def __init__(self, *, url: str, user: str, token: str, timeout: float = 30.0,
                 version: str | None = None, allow_untested_version: bool = False,
                 rack_prefix: str = "rack", client: httpx.Client | None = None,
                 owner_tokens: OwnerTokens | None = None) -> None:
        if not url:
            raise Unsupported("rest_url: required for the slurmrestd transport")
        self.url = url.rstrip("/")
        self.user = user
        self.allow_untested = allow_untested_version
        self.forced_version = version
        self.rack_prefix = rack_prefix
        headers = {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token}
        self.client = client or httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self._dialect: Dialect | None = None
        self.owner_tokens = owner_tokens  # submit_as_owner: signs a token per job owner

    # -- plumbing -----------------------------------------------------------------------------

    def request(self, method: str, path: str, *, query: str = "",
                body: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None) -> dict[str, Any]:
        target = f"{path}?{query}" if query else path
        try:
            resp = self.client.request(method, target, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"slurmrestd {self.url}: {exc}") from exc
        if resp.status_code in (401, 403):
            raise BackendUnavailable(f"slurmrestd refused our token ({resp.status_code})")
        if resp.status_code >= 500 and not resp.content.startswith(b"{"):
            raise BackendUnavailable(f"slurmrestd {resp.status_code}: {resp.text[:200]}")
        try:
            data = resp.json()
        except ValueError:
            raise BackendUnavailable(
                f"slurmrestd {method} {path}: {resp.status_code} {resp.text[:200]}"
            ) from None
        if not isinstance(data, dict):
            raise BackendUnavailable(f"slurmrestd {method} {path}: unexpected body")
        return data

    @staticmethod
    def errors(data: dict[str, Any]) -> list[dict[str, Any]]:
        return [e for e in data.get("errors") or () if isinstance(e, dict)]

    def _check(self, data: dict[str, Any], what: str, *, ok: tuple[int, ...] = ()) -> None:
        bad = [e for e in self.errors(data) if e.get("error_number", e.get("error_code")) not in ok]
        if bad:
            # slurmrestd reports an unreachable slurmctld/slurmdbd as errors in a 200 body
            text = "; ".join(str(e.get("description") or e.get("error")) for e in bad)
            raise BackendUnavailable(f"slurmrestd {what}: {text}")

    def _p(self, path: str, *, db: bool = False) -> str:
        version = self.dialect().openapi
        return f"/{'slurmdb' if db else 'slurm'}/{version}/{path}"

    # -- transport ----------------------------------------------------------------------------

    def dialect(self) -> Dialect:
        if self._dialect is not None:
            return self._dialect
        if self.forced_version:
            self._dialect = dialect_for_openapi(self.forced_version,
                                                allow_untested=self.allow_untested)
            return self._dialect
        doc = self.request("GET", "/openapi/v3")
        served = {p.split("/")[2] for p in doc.get("paths", {}) if p.startswith("/slurm/v")}
        known = [d for d in DIALECTS.values() if d.openapi in served]
        if not known:
            raise Unsupported(f"slurmrestd serves {sorted(served)}; this adapter knows "
                              + ", ".join(d.openapi for d in DIALECTS.values()))
        usable = [d for d in known if d.tested or self.allow_untested]
        if not usable:  # let dialect_for_openapi raise its clear message
            dialect_for_openapi(known[-1].openapi, allow_untested=self.allow_untested)
        self._dialect = usable[-1]
        return self._dialect

    def nodes(self) -> list[NodeRecord]:
        data = self.request("GET", self._p("nodes"))
        self._check(data, "nodes")
        return [parse.sinfo_node(n) for n in data.get("nodes") or ()]

    def topology(self) -> list[Switch]:
        """Racks from node features named ``<rack_prefix>*``, under one block 'cluster'."""
        racks: dict[str, list[str]] = {}
        for node in self.nodes():
            for feature in node.features:
                if feature.startswith(self.rack_prefix):
                    racks.setdefault(feature, []).append(node.name)
        if not racks:
            return []
        leaves = [Switch(name=r, level=0, nodes=tuple(n)) for r, n in sorted(racks.items())]
        root = Switch(name="cluster", level=1, switches=tuple(sorted(racks)))
        return [*leaves, root]

    def jobs(self) -> list[SlurmJob]:
        data = self.request("GET", self._p("jobs"))
        self._check(data, "jobs")
        return [parse.squeue_job(j) for j in data.get("jobs") or ()]

    def find(self, name: str) -> list[SlurmJob]:
        return [j for j in self.jobs() if j.name == name]

    def accounting(self, *, names: Sequence[str] = (), job_ids: Sequence[str] = (),
                   since: datetime) -> list[SlurmJob]:
        reliable = self.dialect().db_exit_code_reliable
        rows: list[SlurmJob] = []
        if names:
            # v0.0.38 parses comma lists only percent-encoded, and times only as dates
            end = (datetime.now() + timedelta(days=1)).strftime("%Y-%m-%d")
            query = "&".join([
                f"job_name={quote(','.join(names), safe='')}",
                f"state={quote(DB_STATES, safe='')}",
                f"start_time={since.astimezone().strftime('%Y-%m-%d')}",
                f"end_time={end}",
            ])
            data = self.request("GET", self._p("jobs", db=True), query=query)
            self._check(data, "accounting", ok=(_NOTHING_FOUND,))
            rows += [parse.db_job(j, exit_code_reliable=reliable) for j in data.get("jobs") or ()]
        seen = {r.job_id for r in rows}
        for job_id in job_ids:
            if job_id in seen:
                continue
            data = self.request("GET", self._p(f"job/{quote(job_id, safe='')}", db=True))
            self._check(data, "accounting", ok=(_NOTHING_FOUND,))
            rows += [parse.db_job(j, exit_code_reliable=reliable) for j in data.get("jobs") or ()]
        return rows

    def node_events(self, nodes: Sequence[str], *, since: datetime) -> list[NodeEvent]:
        """slurmrestd serves no node events (sacctmgr show event): a node that is back in
        service when a job's end is observed leaves no trace over this transport."""
        return []

    def steps(self, job_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """One accounting call per job (only jobs that newly ended FAILED are asked about)."""
        out: dict[str, tuple[str, ...]] = {}
        for job_id in job_ids:
            data = self.request("GET", self._p(f"job/{quote(job_id, safe='')}", db=True))
            self._check(data, "accounting", ok=(_NOTHING_FOUND,))
            for j in data.get("jobs") or ():
                steps = parse.db_steps(j)
                if steps is not None and str(j.get("job_id", job_id)) == job_id:
                    out[job_id] = steps
        return out

    def submit_body(self, job: BatchJob) -> dict[str, Any]:
        dialect = self.dialect()
        if job.switches and not job.constraint:
            raise Unsupported(
                f"slurmrestd {dialect.openapi} has no switch-count field: a rack placement "
                "needs nodes that carry rack features (backend setting rack_features: true)"
            )
        shape = job.shape
        if shape.nodelist:
            log.warning("slurmrestd %s cannot pin nodes; %s may land on other nodes of %s",
                        dialect.openapi, job.name, job.partition)
        if job.exclude:  # its pools say excludes_nodes=False, so admission sends none
            log.warning("slurmrestd transport does not send excluded nodes; %s may start on "
                        "%d node(s) held for a starving gang", job.name, len(job.exclude))
        # SLURM_UMASK: the output file is private from the start, as sbatch makes it
        env = {"PATH": JOB_PATH, "SLURM_UMASK": JOB_UMASK}
        props: dict[str, Any] = {
            "name": job.name, "comment": job.comment, "partition": job.partition,
            "tasks": shape.ntasks, "time_limit": job.time_limit_min,
            "current_working_directory": job.output.rsplit("/", 1)[0],
            "standard_output": job.user_output or job.output,
        }
        if job.user_error:
            props["standard_error"] = job.user_error
        if job.exclusive:
            raise Unsupported("--exclusive: this backend's slurmrestd transport does not send "
                              "it; use transport 'cli' for whole-node jobs")
        if shape.nodes is not None:
            # the v0.0.38 schema says [min, max]; 22.05 honours only an int
            props["nodes"] = shape.nodes if dialect.gres_key == "gres" else str(shape.nodes)
        props.update(self._gpu_fields(job, dialect))
        props["environment"] = ([f"{k}={v}" for k, v in env.items()]
                                if dialect.submit_env_as_list else env)
        signal = job.signal
        if signal and signal.startswith("B:") and not dialect.rest_signal_batch:
            signal = signal[2:]  # v0.0.38 refuses "B:"; without it Slurm signals every rank
        optional = {"signal": signal, "constraints": job.constraint, "account": job.account,
                    "cpus_per_task": job.cpus_per_task, "memory_per_node": job.memory_mb,
                    "memory_per_gpu": job.memory_per_gpu_mb}
        props.update({k: v for k, v in optional.items() if v})
        props.update(self._native_fields(job))
        if dialect.rest_requeue_false_ok:
            props["requeue"] = False
        # else: the rendered script clears Requeue itself when it starts (see script.py)
        if job.hold:
            props["hold"] = True
        if dialect.submit_script_inside_job:
            return {"job": {**props, "script": job.script}}
        return {"script": job.script, "job": props}

    @staticmethod
    def _native_fields(job: BatchJob) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for name, value in job.native:
            field = NATIVE_FIELDS.get(name)
            if field is None or value is None:
                raise Unsupported(
                    f"native.slurm.options: --{name} has no slurmrestd field this adapter "
                    f"sends (it sends {', '.join('--' + n for n in NATIVE_FIELDS)} and "
                    "--constraint); use transport 'cli', or leave the option out")
            if name == "nice":
                try:
                    fields[field] = int(value)
                except ValueError:
                    raise Unsupported(f"native.slurm.options: --nice={value}: a whole number "
                                      "is expected") from None
            else:
                fields[field] = value
        return fields

    @staticmethod
    def _gpu_fields(job: BatchJob, dialect: Dialect) -> dict[str, Any]:
        """The GangShape's tasks and GPUs as fields (seen honoured by slurmrestd v0.0.38:
        tasks, tasks_per_node, gres / gpus_per_node, gpus_per_task, memory_per_gpu)."""
        shape = job.shape
        if shape.tasks_per_node is None:
            gpu = gpu_count(job, per_task_gpus(shape))
            if dialect.gres_key == "gres":
                return {"gpus_per_task": gpu}
            return {"tres_per_task": f"gres/gpu:{gpu}"}
        gpu = gpu_count(job, shape.gpus_per_node)
        fields: dict[str, Any] = {"tasks_per_node": shape.ntasks_per_node}
        if dialect.gres_key != "gres":
            fields["tres_per_node"] = f"gres/gpu:{gpu}"
        elif job.gpu_request == "gres":
            fields["gres"] = f"gpu:{gpu}"
        else:
            fields["gpus_per_node"] = gpu
        return fields

    def submit(self, job: BatchJob, *, as_user: str | None = None) -> str:
        headers = self._owner_headers(as_user) if as_user is not None else None
        data = self.request("POST", self._p("job/submit"), body=self.submit_body(job),
                            headers=headers)
        job_id = data.get("job_id")
        errors = [e for e in self.errors(data) if e.get("error_code") != _HELD]
        if job_id is None or errors:
            text = "; ".join(str(e.get("error") or e.get("description")) for e in errors)
            raise SubmitRefused(f"slurmrestd refused {job.name}: {text or data}")
        if as_user is not None:
            self._check_owner(str(job_id), as_user)
        return str(job_id)

    def _owner_headers(self, user: str) -> dict[str, str]:
        if self.owner_tokens is None:
            raise Unsupported("submitting as the job's owner over slurmrestd needs the "
                              "backend setting rest_jwt_key_file")
        try:
            return self.owner_tokens.headers(user)
        except OwnerTokenError as exc:
            raise SubmitRefused(str(exc)) from None

    def _job(self, job_id: str) -> dict[str, Any] | None:
        data = self.request("GET", self._p(f"job/{quote(job_id, safe='')}"))
        jobs = [j for j in data.get("jobs") or () if isinstance(j, dict)]
        return jobs[0] if jobs else None

    def _check_owner(self, job_id: str, user: str) -> None:
        """The job Slurm queued must be `user`'s, with a uid the owner policy allows: slurmrestd
        queues a name the cluster does not know as 'nobody' (where it never runs), and only the
        cluster knows the uid of a name the broker's host does not. Otherwise the job is
        cancelled and the submission refused."""
        job = self._job(job_id) or {}
        got = str(job.get("user_name") or "")
        if got != user:
            why = (f"no Unix user '{user}' on the cluster to submit the job as "
                   f"(Slurm queued it as '{got or 'unknown'}')")
        else:
            policy = self.owner_tokens.policy if self.owner_tokens else OwnerPolicy()
            why = policy.check_cluster(user, job.get("user_id")) or ""
        if not why:
            return
        self._delete(job_id, None, headers=self._owner_headers(user))
        raise SubmitRefused(f"{why}; job {job_id} cancelled")

    def _delete(self, job_id: str, signal: str | None,
                headers: dict[str, str] | None = None) -> bool:
        if headers is None and self.owner_tokens is not None:
            headers = self._headers_of_owner(job_id)
        query = f"signal={quote(signal, safe='')}" if signal else ""
        data = self.request("DELETE", self._p(f"job/{quote(job_id, safe='')}"), query=query,
                            headers=headers)
        codes = {e.get("error_number") for e in self.errors(data)}
        if _INVALID_JOB in codes:
            return False
        self._check(data, "cancel")
        return True

    def _headers_of_owner(self, job_id: str) -> dict[str, str] | None:
        """With owner tokens, a job is signalled and cancelled as its owner: the broker's own
        token need not be an operator's. None (the broker's token) for root's or unknown jobs."""
        job = self._job(job_id)
        user = str((job or {}).get("user_name") or "")
        if not user or (job or {}).get("user_id") == 0:
            return None
        try:
            return self.owner_tokens.headers(user) if self.owner_tokens else None
        except OwnerTokenError:
            return None

    def signal(self, job_id: str, signal: str) -> bool:
        return self._delete(job_id, f"SIG{signal}" if not signal.startswith("SIG") else signal)

    def signal_steps(self, job_id: str, signal: str) -> bool:
        raise Unsupported("slurmrestd signals the whole job, batch shell included; use "
                          "transport 'cli' to signal the steps as scancel --signal does")

    def signal_full(self, job_id: str, signal: str) -> bool:
        return self.signal(job_id, signal)  # slurmrestd's signal: the whole job

    def cancel(self, job_id: str) -> bool:
        return self._delete(job_id, None)

    def close(self) -> None:
        self.client.close()
