"""The soak (bench/soak.py) against the real local clusters (issue 17, part 3, the 10-minute
variant; not a timed test).

The same harness as bench/soak.py, imported from it: a private PostgreSQL, two `isthmus
server` replicas (one leads the control loop), the open-loop load from four teams (submits with
an Idempotency-Key, a cancel of one submit in ten, list/explain/read requests), the backend
outage at 1/3 of the run, the SIGKILL of the leader at 1/2 (restarted 20 s later), the per
minute p50/p99, 5xx, RSS per replica and admission cycle p95, the drain, the lost/duplicated
counts, `isthmus db check` (twice: while the replicas still run, and once they stopped) and
the same last line
`soak: <minutes> min <N> jobs 5xx <k> lost <l> p99 <T> ms rss growth <g>%`.

What differs:
- the federation is real: the configuration is examples/isthmus-local.yaml with its backends
  pointed at the Slurm cluster of `$ISTHMUS_SLURM_STATE` (CLI transport) and the Kubernetes
  control plane of `$ISTHMUS_K8S_STATE` (kwok fake GPU nodes), pool sizes read from their `env`
  files, four teams sharing each flavor's GPUs, a fresh namespace per run. The clusters must be
  up already (`deploy/testenv/{slurm,k8s}/up` with the same variables); use private ones: the
  outage stops their slurmctld.
- jobs are short: 2-6 s. On Slurm a job really runs: its command posts two progress reports
  (`POST /v1/jobs/{id}/progress` with its `ISTHMUS_PROGRESS_TOKEN`, to replica a, else b) with a
  sleep after each, and appends each answer's HTTP status to `progress-codes` in the work
  directory; the harness counts the 5xx among them. On Kubernetes nothing runs in a pod: kwok
  ends it after the `isthmus.io/fake-duration` annotation (the same 2-6 s); no progress there.
- the outage is real: SIGTERM to the cluster's slurmctld (its pid file), and at its end
  `deploy/testenv/slurm/up` starts it again (run with that cluster's own state dir, port base
  and size, read from its `env` file, so that it restarts this cluster and no other).
  Meanwhile every 5 s the harness notes the jobs whose reason is `BackendUnavailable`; the
  report prints how many distinct jobs it saw, and how many have such an event.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import yaml

from bench.soak import (
    ROOT,
    TEAMS,
    Postgres,
    Replica,
    _run,
    _wait_healthy,
    db_check,
    note,
    soak_options,
    team_auth,
)

SLURM_UP = ROOT / "deploy" / "testenv" / "slurm" / "up"
FAKE = "isthmus.io/fake-"
SHAPES = [(1, 1)] * 5 + [(2, 1), (4, 1), (8, 1), (8, 2)]
"""(gpus per replica, replicas), as bench/soak.py: mostly single GPUs, one 2-node rack gang."""


def cluster_env(state: Path) -> dict[str, str]:
    """The KEY=VALUE lines a testenv `up` wrote to `<state>/env`."""
    out: dict[str, str] = {}
    for line in (state / "env").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            out[key.strip()] = value.strip()
    return out


def slurm_up_env(slurm: dict[str, str], state: Path) -> dict[str, str]:
    """The variables under which `deploy/testenv/slurm/up` finds this very cluster again: its
    state dir, port base (its slurmrestd listens on base + 20) and nodes per partition. With
    another port base or size `up` would wipe it and start a new one, so none is inherited.
    `up`'s other settings that change the cluster (ISTHMUS_SLURM_CGROUP_PLUGIN,
    ISTHMUS_SLURMRESTD_PLUGINS) come from this process's environment: run the soak with the
    values the cluster was made with (unset, as in the runs of
    docs/benchmarks/history/2026-11-29..12-05.md)."""
    rest_port = int(slurm["SLURMRESTD_URL"].rsplit(":", 1)[1])
    per_type = len(slurm["SLURM_NODES"].split(",")) // len(slurm["SLURM_PARTITIONS"].split(","))
    return {"ISTHMUS_SLURM_STATE": str(state), "ISTHMUS_SLURM_PORT_BASE": str(rest_port - 20),
            "ISTHMUS_SLURM_NODES_PER_TYPE": str(per_type)}


def config_for(slurm: dict[str, str], k8s: dict[str, str], namespace: str,
               jobs_dir: Path) -> dict[str, Any]:
    """examples/isthmus-local.yaml pointed at these clusters: pool sizes from their env, four
    teams with an equal share of each flavor's GPUs, the fake-pod annotations allowed, a quick
    control loop and each team calling with its own token (as bench/soak.py)."""
    cfg: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "isthmus-local.yaml").read_text())
    cfg.pop("server", None)
    cfg.pop("database", None)
    for b in cfg["backends"]:
        if b["kind"] == "slurm":
            b["settings"] = {"transport": "cli", "slurm_conf": slurm["SLURM_CONF"],
                             "work_dir": str(jobs_dir)}
        else:
            b["settings"] = {"kubeconfig": k8s["KUBECONFIG"], "namespace": namespace}
    slurm_nodes = len(slurm["SLURM_NODES"].split(",")) // len(slurm["SLURM_PARTITIONS"].split(","))
    k8s_nodes = int(k8s["K8S_NODES_PER_POOL"])
    per_flavor: dict[str, int] = {}
    for p in cfg["pools"]:
        is_slurm = p["backend"] == "slurm-local"
        gpn = int(slurm["SLURM_GPUS_PER_NODE"] if is_slurm else k8s["K8S_GPUS_PER_NODE"])
        nodes = slurm_nodes if is_slurm else k8s_nodes
        p["capacity"] = {**p["capacity"], "nodes": nodes, "gpus_per_node": gpn}
        p["shared"] = True
        per_flavor[p["flavor"]] = per_flavor.get(p["flavor"], 0) + nodes * gpn
    cfg["control"] = {"admission_interval": 1, "dispatch_interval": 0.5,
                      "reconcile_interval": 1, "lease_ttl": 5, "lost_grace": 20}
    cfg["tenancy"] = {"mounts": {}, "exempt_key_prefixes": [FAKE]}
    cfg["cohorts"] = [{"name": "research"}]
    cfg["auth"] = team_auth()  # the load calls as the teams (bench.soak.Load)
    cfg["teams"] = [{"name": t, "cohort": "research",
                     "quotas": {f: {"nominal": gpus // len(TEAMS)}
                                for f, gpus in sorted(per_flavor.items())}}
                    for t in TEAMS]
    return cfg


def job_command(urls: list[str], codes: Path, pause: int) -> list[str]:
    """A job that reports progress twice (step 1 and 2), to the first replica that answers,
    appends each answer's status (000: none answered) to `codes`, sleeping `pause` s after
    each report. The URLs and path are the harness's own; nothing here comes from a user."""
    posts = " ".join(shlex.quote(u) for u in urls)
    script = (
        "for s in 1 2; do c=000; for u in " + posts + "; do "
        'c=$(curl -s -m 10 -o /dev/null -w "%{http_code}" -X POST '
        '-H "Authorization: Bearer $ISTHMUS_PROGRESS_TOKEN" -H "Content-Type: application/json" '
        '-d "{\\"step\\": $s}" "$u/v1/jobs/$ISTHMUS_JOB_ID/progress") && [ "$c" != 000 ] '
        "&& break; done; echo $c >> " + shlex.quote(str(codes)) + f"; sleep {pause}; done"
    )
    return ["bash", "-c", script]


def real_spec(urls: list[str], codes: Path) -> Callable[[str, str, random.Random], dict[str, Any]]:
    """(name, team, rng) -> a short job for either backend: on Slurm it runs `job_command`
    (2 x pause s), on Kubernetes kwok ends its pods after the same time."""

    def make(name: str, team: str, rng: random.Random) -> dict[str, Any]:
        gpus, replicas = rng.choice(SHAPES)
        pause = rng.randint(1, 3)
        return {
            "name": name, "team": team,
            "flavors": rng.choice([["a100-80g"], ["h100-80g"], ["a100-80g", "h100-80g"]]),
            "gang": {"replicas": replicas, "gpus_per_replica": gpus},
            "topology": {"required": "rack"} if replicas > 1 else {},
            "entrypoint": {"image": "registry.local/train:1.0",
                           "command": job_command(urls, codes, pause)},
            "max_runtime": "10m",
            "annotations": {f"{FAKE}duration": f"{2 * pause}s"},
            "retry": {"max_attempts": 5, "backoff": "1s", "max_backoff": "5s"},
        }

    return make


class SlurmctldOutage:
    """The real drill: `begin` sends SIGTERM to the slurmctld of `pidfile` (Slurm's CLI and
    REST then fail: the backend is unreachable); `end` runs `restart` (deploy/testenv/slurm/up,
    which starts the daemons that are not running) in the background. Neither blocks the
    load's event loop. While it lasts, `sample` (called every `every` s from a thread) adds the
    ids of the jobs it finds waiting with BackendUnavailable to `seen`."""

    def __init__(self, pidfile: Path, restart: list[str], env: dict[str, str],
                 sample: Callable[[], set[str]] | None = None, every: float = 5.0) -> None:
        self.pidfile, self.restart, self.env = pidfile, restart, env
        self.sample, self.every = sample, every
        self.seen: set[str] = set()
        self.stopped_pid: int | None = None
        self.restarter: subprocess.Popen[bytes] | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self) -> None:
        self.stopped_pid = int(self.pidfile.read_text().strip())
        os.kill(self.stopped_pid, signal.SIGTERM)
        if self.sample is not None:
            self._thread = threading.Thread(target=self._watch, daemon=True)
            self._thread.start()

    def end(self) -> None:
        self.restarter = subprocess.Popen(self.restart, env=self.env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)
        self._done.set()

    def _watch(self) -> None:
        while not self._done.is_set():
            with contextlib.suppress(Exception):  # a figure for the report, not a verdict
                assert self.sample is not None
                self.seen |= self.sample()
            self._done.wait(self.every)

    def finish(self, timeout: float = 120) -> int | None:
        """Waits for the restart; its exit status (None: never ended)."""
        if self.restarter is None:
            return None
        try:
            return self.restarter.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


def unavailable_now(db: str) -> set[str]:
    with psycopg.connect(db) as conn:
        rows = conn.execute("SELECT id FROM jobs WHERE reason = 'BackendUnavailable'")
        return {r[0] for r in rows}


def unavailable_events(db: str) -> int:
    """Jobs with a BackendUnavailable event in their history."""
    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT count(DISTINCT job_id) FROM job_events "
                           "WHERE reason = 'BackendUnavailable'").fetchone()
    return int(row[0]) if row else 0


def status_classes(codes: Path) -> dict[str, int]:
    """The progress answers the Slurm jobs recorded, by class (2xx, 4xx, 5xx; 0xx: no replica
    answered). Counted in the last line's 5xx as bench/soak.py counts the simulated ones."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in codes.read_text().split():
            key = line[:1] + "xx"
            out[key] = out.get(key, 0) + 1
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """bench/soak.py's options (`--outage`: slurmctld stopped) and the clusters' state dirs."""
    ap = argparse.ArgumentParser(description=__doc__, parents=[soak_options(10, 2)],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slurm-state", type=Path,
                    default=Path(os.environ.get("ISTHMUS_SLURM_STATE", "/tmp/isthmus-slurm")))
    ap.add_argument("--k8s-state", type=Path,
                    default=Path(os.environ.get("ISTHMUS_K8S_STATE", "/tmp/isthmus-k8s")))
    args = ap.parse_args(argv)
    args.split = False
    return args


def main() -> None:
    args = parse_args()
    slurm, k8s = cluster_env(args.slurm_state), cluster_env(args.k8s_state)
    work = Path(tempfile.mkdtemp(prefix="isthmus-soakreal-"))
    os.chmod(work, 0o755)
    codes = work / "progress-codes"
    codes.touch(mode=0o666)
    namespace = f"isthmus-soak-{uuid.uuid4().hex[:6]}"
    config = work / "isthmus.yaml"
    config.write_text(yaml.safe_dump(config_for(slurm, k8s, namespace, work / "jobs")))
    pg = Postgres()
    reps = [Replica(n, config, pg.url, work) for n in ("a", "b")]
    outage = SlurmctldOutage(
        args.slurm_state / "run" / "slurmctld.pid", [str(SLURM_UP)],
        {**os.environ, **slurm_up_env(slurm, args.slurm_state)},
        lambda: unavailable_now(pg.url))
    try:
        for r in reps:
            r.start()
            _wait_healthy(r)
        note(f"replicas: {({r.name: r.proc.pid for r in reps if r.proc})}; work dir {work}; "
             f"namespace {namespace}")
        make = real_spec([r.url for r in reps], codes)
        result = asyncio.run(_run(reps, args, outage, pg.url, make,
                                  lambda: Counter(status_classes(codes)), pg.cpu_s))
        for r in reps:
            r.kill(signal.SIGTERM)
        db_check(pg.url, "after the replicas stopped")
        print(f"slurmctld outage: restart exit {outage.finish()}; jobs seen waiting with "
              f"BackendUnavailable during it {len(outage.seen)}; jobs with a "
              f"BackendUnavailable event {unavailable_events(pg.url)}")
    finally:
        for r in reps:
            r.kill(signal.SIGTERM)
        pg.stop()
        if args.keep:
            print(f"logs in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(result)


if __name__ == "__main__":
    main()
