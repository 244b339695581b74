"""Sustained load on two replicas over one PostgreSQL (issue 17, part 3; not a timed test).

Starts a private PostgreSQL (or uses `--db`), writes a configuration derived from
examples/isthmus.yaml (the simulated federation, `kind: sim`, its pools scaled to the offered
rate; four teams in one cohort, each calling with its own bearer token, as production
authenticates every call) and runs two `isthmus server` processes on it: one leads the
control loop, the other stands by; both serve the API. Then, open loop for `--minutes`:
- `--rate` submits per second, round robin over the four teams and both replicas, each with
  its own name and Idempotency-Key (a request that meets a dead replica is sent again, same key,
  to the other: counted as a connection retry, not a 5xx);
- mixed in: a cancel of one submit in ten (0-10 s after its answer), and per submit a 10%
  chance each of a list (`GET /v1/jobs?team=`), an explain and a job read, each call made as
  the team whose job or list it is (`TOKENS`: a user's read of its own team's jobs, which the
  audit log does not record; until 2026-12-07 the calls were the open API's admin's); the
  simulated jobs themselves post progress reports (`POST /v1/jobs/{id}/progress`) every
  `--progress-every` simulated seconds, each simulated backend's to one of the replicas (a
  load balancer's share);
- at 1/3 of the run the `sim-slurm` backend is unreachable for `--outage` seconds (its
  `outage_file` exists; backends/sim/live.py), at 1/2 the leader is killed with SIGKILL and
  restarted 20 s later (as a service manager would).
Latency is counted from the moment a request was due (open loop: a slow answer delays nothing
else but is charged in full). Per minute: API p50/p99, 5xx, requests, each replica's RSS and
CPU seconds so far (with the private PostgreSQL's as `pg`: its sessions and workers), the
harness's own worst loop lag (a stall of the harness delays the answers it times), and
the admission cycle p95 (from the leader's `isthmus_admission_cycle_seconds` histogram, so it is
a bucket bound). After the run, load stops; the harness waits up to `--drain` seconds for every
job to end, then counts: lost (an answered submit whose job is not in the database),
duplicated (two jobs with one submit's name), stuck (not ended after the drain), failed, and
runs `isthmus db check` twice, printing its mismatch lines: while the replicas still run (a
backlog not drained is still being written), and once they stopped. Last line:
`soak: <minutes> min <N> jobs 5xx <k> lost <l> p99 <T> ms rss growth <g>%` (p99: the worst
minute but the hand-over minute; rss growth: from the end of warm-up to the end, the largest of
the processes, counted apart for each stretch in which a process kept one role, leader or
standby, a killed one up to its kill: `rss_growth`). `--split` runs the API replicas with
`--no-control` and the control loop in two `isthmus control` processes; the kill drill then
kills the leading one.

Each process's database sessions carry its name (a, b, c, d) as their `application_name`, so
the private server's logs say which process waited for which; `SOAK_PGOPTS` adds options to
that server's command line, e.g. `SOAK_PGOPTS="-c log_lock_waits=on -c deadlock_timeout=25ms
-c logging_collector=on -c log_directory=/tmp/pglog -c log_connections=on
-c log_line_prefix=%m_[%p]_%a_"`, then `python -m bench.lock_waits /tmp/pglog/*.log` (how the
lock waits in the benchmarks page were counted).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import faulthandler
import hashlib
import json
import math
import os
import pwd
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import psycopg
import yaml

from broker import gc_settings

ROOT = Path(__file__).resolve().parents[1]
TEAMS = ("vision", "language", "speech", "robotics")
TOKENS = {team: secrets.token_urlsafe(24) for team in TEAMS}
"""Each team's bearer token (this process's, drawn at start): the servers of `write_config`
authenticate every call, and the load calls as the team whose job it is, as users do."""
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}


class Postgres:
    """A private PostgreSQL server (fsync on) in a temp dir, on a loopback port."""

    def __init__(self) -> None:
        found = Path("/usr/lib/postgresql").glob("*/bin")
        bindir = sorted(found, key=lambda p: int(p.parent.name))[-1]
        self.base = Path(tempfile.mkdtemp(prefix="isthmus-soak-pg-"))
        run_as: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
            run_as = [shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin") or "runuser",
                      "-u", "postgres", "--"]
        data = self.base / "data"
        subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U",
                        "isthmus", "-E", "UTF8"], check=True, capture_output=True)
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [*run_as, str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p",
             str(self.port), "-k", str(self.base), "-c", "max_connections=200",
             *os.environ.get("SOAK_PGOPTS", "").split()],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while subprocess.run([str(bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port),
                              "-U", "isthmus", "-d", "postgres", "-qc",
                              "CREATE DATABASE soak"], capture_output=True).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError("PostgreSQL did not start")
            time.sleep(0.3)
        self.url = f"postgresql://isthmus@127.0.0.1:{self.port}/soak"

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server used so far: its postmaster's, with the
        processes it reaped (ended sessions, autovacuum workers), and those still running."""
        tick = os.sysconf("SC_CLK_TCK")
        with contextlib.suppress(OSError, IndexError, ValueError):
            pid = int((self.base / "data" / "postmaster.pid").read_text().split()[0])
            total = sum(_stat(pid)[11:15])
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    with contextlib.suppress(OSError, IndexError, ValueError):
                        fields = _stat(int(entry.name))
                        if fields[1] == pid:
                            total += fields[11] + fields[12]
            return total / tick
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        shutil.rmtree(self.base, ignore_errors=True)


def _stat(pid: int) -> list[int]:
    """/proc/<pid>/stat's numeric fields after the command name (state as 0): [1] the parent,
    [11] utime, [12] stime, [13] cutime, [14] cstime (clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return [0, *(int(f) for f in fields[1:])]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(work: Path, rate: float, outage_file: Path,
                 progress_every: float = 400, progress_to: Sequence[str] = ()) -> Path:
    """examples/isthmus.yaml with its pools scaled to the rate, four teams, a quick control
    loop and the outage drill armed on sim-slurm (off until the file exists); each running
    job reports its progress every `progress_every` simulated seconds (0: the jobs report
    nothing), the jobs of each simulated backend to one of the API URLs `progress_to` in
    turn, as pods reach the replicas through a load balancer (none given: to the process's
    own listener)."""
    cfg = yaml.safe_load((ROOT / "examples" / "isthmus.yaml").read_text())
    # jobs run 20-100 simulated s at speed 10 (~7 s with the start), ~4 GPUs each: 2x room
    nodes = max(8, math.ceil(rate * 7 * 4 * 2 / 8 / 4 / 8) * 8)
    for p in cfg["pools"]:
        p["capacity"] = {"nodes": nodes, "gpus_per_node": 8, "nodes_per_rack": 8,
                         "racks_per_block": 4}
        p["shared"] = True
    for i, b in enumerate(cfg["backends"]):
        if progress_to:
            b["settings"]["progress_url"] = progress_to[i % len(progress_to)]
        if progress_every > 0:
            b["settings"]["progress_interval"] = progress_every
        else:
            b["settings"]["progress"] = False
    cfg["backends"][0]["settings"]["outage_file"] = str(outage_file)
    cfg["control"].update({"admission_interval": 1, "dispatch_interval": 0.5,
                           "reconcile_interval": 1, "lease_ttl": 5, "lost_grace": 20})
    share = nodes * 8 * 2 // len(TEAMS)  # per flavor: two pools of `nodes` nodes
    cfg["teams"] = [{"name": t, "cohort": "research",
                     "quotas": {f: {"nominal": share} for f in ("h100-80g", "a100-80g")}}
                    for t in TEAMS]
    cfg["tenancy"]["mounts"] = {}
    cfg["auth"] = team_auth()
    cfg["slurm_compat"]["accounts"] = {t: t for t in TEAMS}
    path = work / "isthmus.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Outage(Protocol):
    """A backend made unreachable by `begin` and reachable again by `end` (the drill)."""

    def begin(self) -> None: ...

    def end(self) -> None: ...


@dataclass
class FileOutage:
    """The simulated backend's drill: `sim-slurm` is unreachable while its `outage_file`
    exists (backends/sim/live.py)."""

    path: Path

    def begin(self) -> None:
        self.path.write_text("drill\n")

    def end(self) -> None:
        self.path.unlink(missing_ok=True)


class Replica:
    """A process of the broker: `server` (API and, when it leads, the control loop), `api`
    (`server --no-control`) or `control` (`isthmus control`, no API; `--split`)."""

    def __init__(self, name: str, config: Path, db: str, work: Path, role: str = "server",
                 api_port: int = 0, nice: int = 0) -> None:
        self.name, self.config, self.db, self.role = name, config, db, role
        self.nice = nice
        """Started under `nice -n` this (0: as the harness): its CPU weight against the
        others' on a shared machine, as a deployment's CPU requests set it per pod."""
        self.port = api_port if role == "control" else _free_port()
        self.metrics_port = _free_port() if role == "control" else self.port
        self.url = f"http://127.0.0.1:{self.metrics_port}"  # control: its metrics only
        self.log = work / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            args = (["control", "--api-port", str(self.port), "--metrics-port",
                     str(self.metrics_port)] if self.role == "control" else
                    ["server", "--port", str(self.port)]
                    + (["--no-control"] if self.role == "api" else []))
            nice = ["nice", "-n", str(self.nice)] if self.nice else []  # exec'd: same pid
            self.proc = subprocess.Popen(
                [*nice, sys.executable, "-m", "broker.cli.main", args[0], "--config",
                 str(self.config), "--db", self.db, *args[1:]],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT), "PGAPPNAME": self.name},
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_mb(self) -> float:
        if not self.alive() or self.proc is None:
            return 0.0
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the replica's process used so far (0 if it is down)."""
        if not self.alive() or self.proc is None:
            return 0.0
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = _stat(self.proc.pid)
            return (fields[11] + fields[12]) / os.sysconf("SC_CLK_TCK")
        return 0.0

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.alive():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


def spec(name: str, team: str, rng: random.Random) -> dict[str, Any]:
    gpus, replicas = rng.choice([(1, 1)] * 5 + [(2, 1), (4, 1), (8, 1), (8, 2)])
    return {
        "name": name, "team": team, "flavors": rng.choice([["a100-80g"], ["h100-80g"],
                                                          ["a100-80g", "h100-80g"]]),
        "gang": {"replicas": replicas, "gpus_per_replica": gpus},
        "topology": {"required": "rack"} if replicas > 1 else {},
        "entrypoint": {"image": "registry.local/train:1.0", "command": ["python", "train.py"]},
        "max_runtime": "10m",
        "annotations": {"isthmus.io/sim-duration": str(rng.randint(20, 100))},
        "retry": {"max_attempts": 5, "backoff": "1s", "max_backoff": "5s"},
    }


@dataclass
class Stats:
    lat: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    by_kind: dict[int, dict[str, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    """minute -> "<request kind>@<replica>" -> latencies (ms): which requests make the p99."""
    err5: Counter[int] = field(default_factory=Counter)
    other: Counter[tuple[int, str]] = field(default_factory=Counter)
    retries: Counter[int] = field(default_factory=Counter)
    lag: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    """minute -> how late (ms) the harness's own loop woke from 10 ms sleeps: a stall of the
    harness delays the answers it times, which the server did not cause."""
    acked: dict[str, str] = field(default_factory=dict)  # name -> job id
    recent: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=500))
    """The last answered submits' (job id, team)."""
    unanswered: list[str] = field(default_factory=list)


@dataclass
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Conns:
    """Keep-alive HTTP/1.1 connections to one replica (raw asyncio: a general client's pool
    costs more CPU than the server under test on two shared cores)."""

    def __init__(self, port: int, size: int) -> None:
        self.port, self.size = port, size
        self.reopened = 0  # kept connections that failed and were opened again, request resent
        self.free: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None] = (
            asyncio.Queue())
        for _ in range(size):
            self.free.put_nowait(None)  # opened on first use

    async def request(self, method: str, path: str, body: bytes | None,
                      headers: dict[str, str]) -> Answer:
        conn = await self.free.get()
        for _ in range(2):  # a kept connection the server closed (idle > its keep-alive
            reused = conn is not None  # timeout, 5 s: low rates) is opened again, once
            try:
                if conn is None:
                    conn = await asyncio.wait_for(
                        asyncio.open_connection("127.0.0.1", self.port), 10)
                status, data = await self._exchange(conn, method, path, body, headers)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError,
                    IndexError) as exc:
                if conn is not None:
                    conn[1].close()
                conn = None
                if reused and not isinstance(exc, TimeoutError):  # a slow server: no retry
                    self.reopened += 1  # counted (a drop without an answer looks the same)
                    continue
                self.free.put_nowait(None)
                raise ConnectionError(f"replica on port {self.port}") from None
            self.free.put_nowait(conn)
            return Answer(status, data)
        self.free.put_nowait(None)
        raise ConnectionError(f"replica on port {self.port}")

    @staticmethod
    async def _exchange(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], method: str,
                        path: str, body: bytes | None,
                        headers: dict[str, str]) -> tuple[int, bytes]:
        reader, writer = conn
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}"
                f"Content-Type: application/json\r\nContent-Length: {len(body or b'')}"
                "\r\n\r\n").encode()
        writer.write(head + (body or b""))
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        status = int(raw.split(b" ", 2)[1])
        length = 0
        for line in raw.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return status, await asyncio.wait_for(reader.readexactly(length), 60)


def team_auth() -> dict[str, Any]:
    """The `auth` of the soaks' servers: as production runs, every call authenticated, each
    team with its own token (`TOKENS`), so a user's read of its own team's jobs is not an
    admin's audited read."""
    return {"mode": "token", "tokens": [
        {"name": f"soak-{t}", "team": t, "role": "user",
         "token_sha256": hashlib.sha256(TOKENS[t].encode()).hexdigest()} for t in TEAMS]}


def as_team(team: str) -> dict[str, str]:
    """The headers of a call made by one of `team`'s users (its token, `TOKENS`)."""
    return {"Authorization": f"Bearer {TOKENS[team]}"}


def request_kind(method: str, path: str) -> str:
    if method == "POST":
        return "cancel" if path.endswith("/cancel") else "submit"
    if "?" in path:
        return "list"
    return "explain" if path.endswith("/explain") else "read"


class Load:
    def __init__(self, processes: list[Replica], t0: float, stats: Stats, seed: int,
                 db: str = "", make_spec: Any = None,
                 server_cpu: Callable[[], float] | None = None) -> None:
        self.processes, self.db = processes, db
        self.server_cpu = server_cpu
        """The database server's CPU seconds so far (a private server's), if known."""
        self.make_spec = make_spec or spec
        """(name, team, rng) -> the job spec of one submit."""
        replicas = [r for r in processes if r.role != "control"]
        self.replicas, self.t0, self.stats = replicas, t0, stats
        self.rng = random.Random(seed)
        self.conns = {r.name: Conns(r.port, 24) for r in replicas}
        self.rr = 0
        self.down: dict[str, float] = {}
        """Replica -> when to try it again after a connection error."""
        self.tasks: set[asyncio.Task[None]] = set()

    def minute(self, t: float) -> int:
        return int((t - self.t0) // 60)

    async def call(self, method: str, path: str, due: float, body: Any = None,
                   headers: dict[str, str] | None = None) -> Answer | None:
        """One request, to the next replica; on a connection error the other one (same body
        and headers, so a submit keeps its Idempotency-Key)."""
        raw = json.dumps(body).encode() if body is not None else None
        self.rr += 1
        for attempt in range(40):  # about a minute of trying
            now = time.monotonic()
            up = [r for r in self.replicas if self.down.get(r.name, 0.0) <= now] or self.replicas
            r = up[(self.rr + attempt) % len(up)]
            try:
                resp = await self.conns[r.name].request(method, path, raw, headers or {})
            except ConnectionError:
                self.stats.retries[self.minute(time.monotonic())] += 1
                self.down[r.name] = time.monotonic() + 2.0  # try it again in 2 s
                await asyncio.sleep(min(2.0, 0.1 * attempt))
                continue
            now = time.monotonic()
            m = self.minute(due)
            self.stats.lat[m].append((now - due) * 1000)
            self.stats.by_kind[m][f"{request_kind(method, path)}@{r.name}"].append(
                (now - due) * 1000)
            if resp.status >= 500:
                self.stats.err5[m] += 1
            elif resp.status >= 400 and resp.status != 409:
                self.stats.other[(resp.status, path.split("/")[-1][:12])] += 1
            return resp
        return None

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def submit(self, i: int, due: float) -> None:
        team = TEAMS[i % len(TEAMS)]
        name = f"soak-{i:07d}"
        body = self.make_spec(name, team, self.rng)
        resp = await self.call("POST", "/v1/jobs", due, body,
                               {"Idempotency-Key": name, **as_team(team)})
        if resp is None or resp.status not in (200, 201):
            self.stats.unanswered.append(name)
            return
        job_id = resp.json()["id"]
        self.stats.acked[name] = job_id
        self.stats.recent.append((job_id, team))
        if self.rng.random() < 0.1:
            await asyncio.sleep(self.rng.uniform(0, 10))
            await self.call("POST", f"/v1/jobs/{job_id}/cancel", time.monotonic(),
                            headers=as_team(team))

    async def read(self, i: int, due: float) -> None:
        x = self.rng.random()
        recent = self.stats.recent
        if x < 0.1:
            team = TEAMS[i % 4]
            await self.call("GET", f"/v1/jobs?team={team}&limit=50", due, headers=as_team(team))
        elif x < 0.2 and recent:
            job_id, team = self.rng.choice(recent)
            await self.call("GET", f"/v1/jobs/{job_id}/explain", due, headers=as_team(team))
        elif x < 0.3 and recent:
            job_id, team = self.rng.choice(recent)
            await self.call("GET", f"/v1/jobs/{job_id}", due, headers=as_team(team))

    async def run(self, rate: float, seconds: float) -> int:
        i = 0
        while True:
            due = self.t0 + i / rate
            if due - self.t0 >= seconds:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            self.spawn(self.submit(i, due))
            self.spawn(self.read(i, due))
            i += 1
        while self.tasks:
            await asyncio.sleep(0.5)
        return i


async def harness_lag(load: Load, tick: float = 0.01) -> None:
    """How late the harness's loop wakes from `tick` sleeps, into `load.stats.lag`."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(tick)
        load.stats.lag[load.minute(time.monotonic())].append((loop.time() - t - tick) * 1000)


def _histogram(text: str, name: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            le = line.split('le="')[1].split('"')[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def _p95(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The bucket bound holding the 95th percentile of the cycles between two scrapes."""
    delta = {le: after.get(le, 0) - before.get(le, 0) for le in after}
    total = delta.get(float("inf"), 0)
    if total <= 0:
        return None
    for le in sorted(delta):
        if delta[le] >= 0.95 * total:
            return le
    return None


class Scrapes:
    """The monitor's reads of the processes' /metrics: the admission cycle histogram of each,
    as last read. One client for the run (a new one loads the CA bundle, tens of ms of CPU);
    `start` reads them all once before the load, so that minute 1 counts from there and the
    client's first request, which imports what it needs (anyio's event: 30-60 ms of the loop,
    in minute 2 of every run when it came with the first minute's scrape), is not timed."""

    def __init__(self, processes: list[Replica]) -> None:
        self.processes = processes
        self.client = httpx.AsyncClient()
        self.hist: dict[str, dict[float, float]] = {}

    async def start(self) -> None:
        await self.cycle_p95()

    async def cycle_p95(self) -> float | None:
        """The admission cycle p95 bound since the last read (a process that led meanwhile)."""
        cycle = None
        for r in self.processes:
            with contextlib.suppress(httpx.HTTPError):
                text = (await self.client.get(r.url + "/metrics", timeout=10)).text
                h = _histogram(text, "isthmus_admission_cycle_seconds")
                before = self.hist.get(r.name, {})
                if h.get(float("inf"), 0) < before.get(float("inf"), 0):
                    before = {}  # the replica was restarted: its counters too
                if h.get(float("inf"), 0) > before.get(float("inf"), 0):
                    cycle = _p95(before, h)
                self.hist[r.name] = h
        return cycle

    async def close(self) -> None:
        await self.client.aclose()


async def monitor(load: Load, seconds: float, rows: dict[int, dict[str, Any]],
                  events: dict[str, float], outage: Outage, outage_s: float,
                  scrapes: Scrapes, drills: bool = True) -> None:
    """Once a minute: RSS and the admission cycle p95; drives the outage and the kill (unless
    `drills` is off)."""
    outage_at, kill_at = (seconds / 3, seconds / 2) if drills else (math.inf, math.inf)
    killed: Replica | None = None
    next_minute = 60.0
    # The blocking reads (/proc, the lease) in a thread: the loop that sends the load and
    # times its answers must not stall on the monitor's own work (the harness's lag, `lag`).
    client = scrapes.client
    while True:
        el = time.monotonic() - load.t0
        if el >= next_minute or el >= seconds:
            m = int(next_minute // 60) - 1
            cycle = await scrapes.cycle_p95()
            leader = await _leader(load, client)
            rows[m] = await asyncio.to_thread(_sample, load.processes, load.server_cpu)
            rows[m].update(cycle_p95=cycle, leader=leader.name if leader else None)
            lat = load.stats.lat.get(m, [])
            note(f"minute {m + 1}: {len(lat)} requests p99 {pct(lat, 0.99):.0f} ms "
                 f"5xx {load.stats.err5.get(m, 0)} rss {rows[m]['rss']} cycle p95 "
                 f"{_bound(cycle)} cpu s so far {rows[m]['cpu']}")
            next_minute += 60
            if el >= seconds:
                return
        if "outage" not in events and el >= outage_at:
            outage.begin()
            events["outage"] = el
            note("outage starts")
        ending = "outage" in events and "outage_end" not in events
        if ending and el >= events["outage"] + outage_s:
            outage.end()
            events["outage_end"] = el
        if "kill" not in events and el >= kill_at:
            killed = await _leader(load, client)
            if killed is not None:
                killed.kill()
                events["kill"] = el
                note(f"leader {killed.name} killed")
                events["killed_" + killed.name] = el
        if killed is not None and "restart" not in events and el >= events["kill"] + 20:
            killed.start()
            events["restart"] = el
        await asyncio.sleep(1)


def _sample(processes: list[Replica], server_cpu: Callable[[], float] | None = None
            ) -> dict[str, Any]:
    """Each process's RSS and CPU seconds so far (reads of /proc), and the database server's
    CPU seconds as `pg` when known (`Postgres.cpu_s`)."""
    cpu = {r.name: round(r.cpu_s()) for r in processes}
    if server_cpu is not None:
        cpu["pg"] = round(server_cpu())
    return {"rss": {r.name: r.rss_mb() for r in processes}, "cpu": cpu}


async def _leader(load: Load, client: httpx.AsyncClient) -> Replica | None:
    control = [r for r in load.processes if r.role == "control"]
    if control:  # no API to ask: the lease's holder is "<host>:<pid>:<nonce>"
        pids = await asyncio.to_thread(_lease_holders, load.db)
        return next((r for r in control if r.proc and str(r.proc.pid) in pids), None)
    for r in load.replicas:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            h = (await client.get(r.url + "/healthz", timeout=5)).json()
            if h.get("control") == "leader":
                return r
    return None


def _lease_holders(db: str) -> set[str]:
    """The pids of the processes holding an unexpired lease."""
    with psycopg.connect(db) as conn:
        rows = conn.execute("SELECT holder FROM leader_lease WHERE expires_at > now()")
        return {h.split(":")[1] for (h,) in rows}


def _bound(cycle: float | None) -> str:
    if cycle is None:
        return "-"
    return "> 10 s" if math.isinf(cycle) else f"<= {cycle:g} s"


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else 0.0


def progress_answers(logs: list[Path]) -> Counter[str]:
    """Progress reports the simulated jobs posted, by answer class, from the logs of the
    processes that run the simulator (backends/sim/progress.py `Reporter`): they are API calls
    too, and 5xx among them count. Each reporter's last tally (every 30 s and at exit: final
    for a process that stopped, a lower bound for one killed), but the 5xx are its lines, one
    each. A process runs a reporter per simulated backend, each with its own tally."""
    last: dict[tuple[Path, str, str], Counter[str]] = {}
    errors = 0
    tally = re.compile(r"progress reports answered so far \(pid (\d+), ([^)]*)\): (\{.*\})")
    for log in logs:
        with contextlib.suppress(OSError), open(log, errors="replace") as f:
            for line in f:
                if (found := tally.search(line)) is not None:
                    last[log, found[1], found[2]] = Counter(ast.literal_eval(found[3]))
                elif " WARNING " in line and "progress of " in line and " answered 5" in line:
                    errors += 1
    out: Counter[str] = sum(last.values(), Counter())
    out["5xx"] = max(out["5xx"], errors)
    return +out


def final_counts(db: str, stats: Stats, wall0: float) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(db.replace("postgresql+psycopg", "postgresql")) as conn:
        rows = conn.execute("SELECT id, name, state FROM jobs").fetchall()
        admitted = conn.execute("SELECT extract(epoch FROM at) FROM job_events "
                                "WHERE to_state = 'ADMITTED'").fetchall()
        stages: list[Any] = []
        with contextlib.suppress(psycopg.Error):  # a figure for the report, not a verdict
            stages = conn.execute(_STAGES).fetchall()
    per_minute: Counter[int] = Counter(int((float(a) - wall0) // 60) + 1 for (a,) in admitted)
    by_name: dict[str, list[str]] = defaultdict(list)
    states: Counter[str] = Counter()
    for job_id, name, state in rows:
        by_name[name].append(job_id)
        states[state] += 1
    ids = {r[0] for r in rows}
    lost = [n for n, i in stats.acked.items() if i not in ids]
    dup = [n for n, v in by_name.items() if len(v) > 1]
    stuck = sum(c for s, c in states.items() if s not in TERMINAL)
    return {"jobs": len(rows), "lost": lost, "duplicated": dup, "stuck": stuck,
            "states": dict(states), "admitted_per_minute": dict(sorted(per_minute.items())),
            "stages": {name: (round(p50, 1), round(p95, 1)) for name, p50, p95 in stages}}


# How long a job that succeeded spent in each stage (first event of each state), p50 and p95 s:
# admitted -> object made (dispatch), made -> seen running, running -> seen ended (the run and
# the reconciler's lag), admitted -> ended (how long it held its quota).
_STAGES = """
WITH f AS (SELECT job_id, to_state, min(extract(epoch FROM at)) AS t FROM job_events
           GROUP BY job_id, to_state),
     j AS (SELECT a.t AS adm, p.t AS prep, r.t AS run, e.t AS ended
           FROM f a JOIN f p ON p.job_id = a.job_id AND p.to_state = 'PREPARING'
           JOIN f r ON r.job_id = a.job_id AND r.to_state = 'RUNNING'
           JOIN f e ON e.job_id = a.job_id AND e.to_state = 'SUCCEEDED'
           WHERE a.to_state = 'ADMITTED'),
     d AS (SELECT 'dispatch' AS s, prep - adm AS v FROM j UNION ALL
           SELECT 'to running', run - prep FROM j UNION ALL
           SELECT 'running to ended', ended - run FROM j UNION ALL
           SELECT 'admitted to ended', ended - adm FROM j)
SELECT s, percentile_cont(0.5) WITHIN GROUP (ORDER BY v),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY v) FROM d GROUP BY s
"""


async def drain(db: str, limit: float) -> None:
    import psycopg

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with psycopg.connect(db) as conn:
            n = conn.execute("SELECT count(*) FROM jobs WHERE state NOT IN "
                             "('SUCCEEDED','FAILED','CANCELLED','REJECTED')").fetchone()
        if n is None or n[0] == 0:
            return
        await asyncio.sleep(5)


def report(rows: dict[int, dict[str, Any]], stats: Stats, events: dict[str, float],
           warmup: int) -> tuple[float, float]:
    names = sorted(next(iter(rows.values()))["rss"]) if rows else []
    print("min  requests  p50 ms  p99 ms  5xx  conn-retries  " +
          "  ".join(f"rss {n} MB" for n in names) + "  harness lag max ms  admission cycle p95")
    handover = int(events.get("kill", -60) // 60)
    worst = 0.0
    for m in sorted(rows):
        lat = stats.lat.get(m, [])
        p99 = pct(lat, 0.99)
        if m != handover or len(rows) == 1:  # a one-minute run has only that minute
            worst = max(worst, p99)
        cyc = rows[m]["cycle_p95"]
        mark = " (outage)" if int(events.get("outage", -1e9) // 60) <= m <= int(
            events.get("outage_end", -1e9) // 60) else ""
        mark += " (leader killed)" if m == handover else ""
        print(f"{m + 1:>3}  {len(lat):>8}  {pct(lat, 0.5):6.1f}  {p99:6.1f}  "
              f"{stats.err5.get(m, 0):>3}  {stats.retries.get(m, 0):>12}  " +
              "  ".join(f"{rows[m]['rss'][n]:>9.0f}" for n in names) +
              f"  {max(stats.lag.get(m, [0.0])):>18.0f}  {_bound(cyc)}{mark}")
    print("p99 ms (count) per request kind and replica, per minute:")
    for m in sorted(rows):
        kinds = stats.by_kind.get(m, {})
        print(f"{m + 1:>3}  " + "  ".join(
            f"{k} {pct(v, 0.99):.0f} ({len(v)})" for k, v in sorted(kinds.items())))
    return worst, rss_growth(rows, names, events, warmup)


def rss_growth(rows: dict[int, dict[str, Any]], names: list[str], events: dict[str, float],
               warmup: int) -> float:
    """The largest RSS growth (%) of any process, from the end of warm-up to the end of each
    stretch of minutes in which one process kept one role (leading the control loop or not):
    a standby that takes over holds the leader's caches from then on, which is a new role,
    not growth over time. A killed process counts up to its last sample before the kill
    (`killed_<name>` in `events`, seconds; minute m is sampled at (m + 1) * 60), and the one
    restarted in its place is a new process, as is one seen again after a minute it was down
    (such a minute is left out). A stretch's first `warmup` minutes do not count (the first
    stretch starts at minute 0, as before); a minute without a known leader keeps the role
    before it, but for a new process's first (a standby then)."""
    growth = 0.0
    for n in names:
        killed = events.get(f"killed_{n}", math.inf)
        stretches: list[list[float]] = []
        key: tuple[tuple[bool, int], bool] | None = None
        start = downs = 0
        for m in sorted(rows):
            rss = rows[m]["rss"].get(n, 0.0)
            if not rss:  # down: what runs under this name next is another process
                downs += 1
                continue
            life = ((m + 1) * 60 > killed, downs)
            leader = rows[m].get("leader")
            same = key is not None and key[0] == life
            role = key[1] if leader is None and key is not None and same else leader == n
            if (life, role) != key:
                key, start = (life, role), m
                stretches.append([])
            if m - start >= warmup:
                stretches[-1].append(rss)
        for after in stretches:
            if len(after) > 1:
                growth = max(growth, (after[-1] / after[0] - 1) * 100)
    return growth


def db_check(db: str, when: str) -> int:
    """Run `isthmus db check`; print its first mismatch and ledger lines (up to 30) and its
    summary; its exit code."""
    check = subprocess.run([sys.executable, "-m", "broker.cli.main", "db", "check", "--db", db],
                           cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"})
    lines = check.stdout.strip().splitlines()
    problems = [x for x in lines if x.startswith(("MISMATCH", "LEDGER"))]
    print(f"db check {when} (exit {check.returncode}): {lines[-1:]}"
          f"{check.stderr.strip()[-300:]}")
    for line in problems[:30]:
        print(f"  {line}")
    return check.returncode


def note(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def soak_options(minutes: float, rate: float) -> argparse.ArgumentParser:
    """The options of both soaks (this one and bench/soak_real.py), as a parent parser; each
    soak gives its own run length and rate."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--minutes", type=float, default=minutes)
    ap.add_argument("--rate", type=float, default=rate, help="submits per second")
    ap.add_argument("--outage", type=float, default=60,
                    help="seconds the Slurm backend is down (the drill at 1/3 of the run)")
    ap.add_argument("--warmup", type=int, default=2, help="minutes before RSS growth counts")
    ap.add_argument("--drain", type=float, default=300, help="seconds to wait for jobs to end")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--no-drills", action="store_true",
                    help="skip the backend outage and the leader kill (a profile or trial run)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, parents=[soak_options(30, 200)],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", help="PostgreSQL URL (default: a private server)")
    ap.add_argument("--split", action="store_true",
                    help="API replicas a, b with --no-control and the control loop in two "
                    "processes of its own, c and d (`isthmus control`); the kill drill kills "
                    "the leading one")
    ap.add_argument("--control-nice", type=int, default=0,
                    help="with --split: start the control processes under `nice -n` this, "
                    "so the API replicas take a shared core first, as a deployment that "
                    "gives the loop's pod a smaller CPU request than the API's (default 0: "
                    "equal weight)")
    ap.add_argument("--progress-every", type=float, default=400,
                    help="simulated seconds between a running job's progress reports (the "
                    "simulators post them, four senders per backend; at speed 10, 400 is a "
                    "report every 40 wall seconds, so each job's first report and few more: "
                    "about one per job); 0: no reports")
    args = ap.parse_args(argv)
    if args.control_nice and not args.split:
        ap.error("--control-nice needs --split: without it the control loop runs in the API "
                 "replicas' own processes")
    return args


def main() -> None:
    faulthandler.register(signal.SIGUSR1)
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="isthmus-soak-"))
    pg = None if args.db else Postgres()
    db = args.db or (pg.url if pg else "")
    outage = work / "sim-slurm.outage"
    config = work / "isthmus.yaml"
    reps = [Replica(n, config, db, work, role="api" if args.split else "server")
            for n in ("a", "b")]
    write_config(work, args.rate, outage, args.progress_every, [r.url for r in reps])
    if args.split:  # the control loop in processes of their own
        reps += [Replica(n, config, db, work, role="control", api_port=reps[0].port,
                         nice=args.control_nice) for n in ("c", "d")]
    try:
        for r in reps:
            r.start()
            _wait_healthy(r)
        note(f"replicas: {({r.name: r.proc.pid for r in reps if r.proc})}; work dir {work}")
        result = asyncio.run(_run(reps, args, FileOutage(outage), db,
                                  server_cpu=pg.cpu_s if pg is not None else None))
        for r in reps:
            r.kill(signal.SIGTERM)
        db_check(db, "after the replicas stopped")
    finally:
        for r in reps:
            r.kill(signal.SIGTERM)
        if pg is not None:
            pg.stop()
        if args.keep:
            print(f"logs in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(result)


def _wait_healthy(r: Replica) -> None:
    if r.role == "control":  # no API: started once it logs so
        _wait_logged(r, "control loop started")
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(r.url + "/healthz", timeout=2).status_code == 200:
                return
        if not r.alive():
            raise RuntimeError(f"replica {r.name} exited: {r.log.read_text()[-2000:]}")
        time.sleep(0.5)
    raise RuntimeError(f"replica {r.name} did not answer")


def _wait_logged(r: Replica, text: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if r.log.exists() and text in r.log.read_text(errors="replace"):
            return
        if not r.alive():
            raise RuntimeError(f"{r.name} exited: {r.log.read_text()[-2000:]}")
        time.sleep(0.5)
    raise RuntimeError(f"{r.name} did not start")


async def _run(reps: list[Replica], args: argparse.Namespace, outage: Outage, db: str,
               make_spec: Any = None, progress_of: Any = None,
               server_cpu: Callable[[], float] | None = None) -> str:
    """The run, the drain and the report; its last line. `make_spec` (default `spec`) makes a
    submit's job; `progress_of` (default: the replicas' logs, `progress_answers`) counts the
    jobs' progress reports by answer class; `server_cpu`: the database server's CPU seconds
    so far (a private server's, `Postgres.cpu_s`), shown with the processes'."""
    seconds = args.minutes * 60
    stats = Stats()
    rows: dict[int, dict[str, Any]] = {}
    events: dict[str, float] = {}
    wall0 = time.time()
    scrapes = Scrapes(reps)
    try:
        await scrapes.start()
        load = Load(reps, time.monotonic(), stats, args.seed, db, make_spec, server_cpu)
        drills = not args.no_drills
        mon = asyncio.ensure_future(monitor(load, seconds, rows, events, outage, args.outage,
                                            scrapes, drills))
        lag = asyncio.ensure_future(harness_lag(load))
        # the harness's collector as the broker's processes set theirs: its first full
        # collection walked every object of its start-up (httpx, psycopg, yaml) and stalled
        # the load for 44 ms in minute 2 of every run, charged to the requests it was timing
        with gc_settings.settled():
            n = await load.run(args.rate, seconds)
        lag.cancel()
        note(f"load done: {n} submits offered")
        await mon
    finally:
        await scrapes.close()
    sent_at = time.monotonic()
    await drain(db, args.drain)
    drained_s = time.monotonic() - sent_at
    note(f"drained in {drained_s:.0f} s")
    worst, growth = report(rows, stats, events, args.warmup)
    counts = final_counts(db, stats, wall0)
    db_check(db, "while the replicas still run")
    progress = (progress_of() if progress_of is not None
                else progress_answers([r.log for r in reps]))
    err5 = sum(stats.err5.values()) + progress.get("5xx", 0)
    print("progress reports posted by the jobs, by answer (5xx: each; the others: the "
          "simulators' last tallies, final but for a killed process's): "
          f"{dict(progress)}")
    print(f"events (s into the run): {json.dumps({k: round(v) for k, v in events.items()})}")
    print(f"offered {n} submits at {args.rate:g}/s; answered {len(stats.acked)}; unanswered "
          f"{len(stats.unanswered)}; other 4xx {dict(stats.other)}")
    print("kept connections reopened and the request sent again, per replica: "
          f"{ {name: c.reopened for name, c in load.conns.items()} }")
    print(f"after the load: drained in {drained_s:.0f} s; jobs by state {counts['states']}; "
          f"stuck {counts['stuck']}; duplicated {len(counts['duplicated'])}; lost "
          f"{len(counts['lost'])} {counts['lost'][:5]}")
    print("admissions (ADMITTED events) per minute of the run (minutes past the load are the "
          f"drain): {counts['admitted_per_minute']}")
    print(f"succeeded jobs' stages, p50 / p95 s: {counts['stages']}")
    return (f"soak: {args.minutes:g} min {counts['jobs']} jobs 5xx {err5} lost "
            f"{len(counts['lost'])} p99 {worst:.0f} ms rss growth "
            f"{growth:.1f}%")


if __name__ == "__main__":
    main()
