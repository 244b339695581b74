"""Benchmark: Isthmus vs Kueue admitting the same gangs on the same real control plane.

Needs the Kueue-enabled local cluster (``deploy/testenv/k8s/up --with-kueue``, started here:
by default a cluster of its own beside the default one, state ``$ISTHMUS_K8S_STATE-kueue`` and
port base ``$ISTHMUS_K8S_PORT_BASE + 200``; ``ISTHMUS_K8S_KUEUE_STATE`` /
``ISTHMUS_K8S_KUEUE_PORT_BASE`` override). Kueue is configured by
``deploy/testenv/k8s/kueue/queues.yaml`` like examples/isthmus-local.yaml's Kubernetes pools;
Isthmus runs with the same teams, quotas and pools in plain mode.

One run, one system after the other, the cluster emptied in between. The same N gangs
(seeded): half "large" (1-4 replicas x 8 GPUs), half "small" (2-8 replicas x 1-4 GPUs), two
teams, a100 or h100, half requiring one rack; every pod runs ``--duration`` once bound.

(a) Kueue: suspended Indexed Jobs with the LocalQueue label (and, for rack gangs, the
    ``kueue.x-k8s.io/podset-required-topology`` annotation) created straight in the team's
    namespace; (b) Isthmus: the same gangs POSTed to ``/v1/jobs`` (Kubernetes backend, plain
    mode, namespace ``isthmus-{team}``).

Reported per system: admissions per second from the first submit to the last admission
(Kueue: the Workload's Admitted condition; Isthmus: the job's ADMITTED event), gangs fully
scheduled per second, submit -> all pods scheduled p50/p95 (from the pods' PodScheduled
times, 1 s resolution), the share of rack gangs whose pods all landed in one rack, and GPU
allocation over time (bound, unfinished pods' GPUs / the cluster's GPUs, sampled), the
capacity bound of the workload (its GPU-seconds over the cluster's GPUs), and where each gang's
time goes (bench/vs_kueue_phases.py: submit -> admitted -> Job started -> pods created ->
scheduled -> running -> done -> Job complete -> quota released, and release -> next admission).

    .venv/bin/python -m bench.vs_kueue [--gangs 1000] [--duration 5s] [--seed 7]
        [--systems kueue,isthmus]

Last line: ``vs-kueue: isthmus <R1> gangs/s kueue <R2> gangs/s ratio <X> in-domain isthmus
<a>% kueue <b>%``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.vs_kueue_phases import Phases, add_jobs, add_pods, add_workloads, capacity_bound, ts
from bench.vs_kueue_phases import table as phase_table
from tests.fixtures.k8s import (
    kueue_env,  # the Kueue cluster the tests start, the same dirs and ports
)

ROOT = Path(__file__).resolve().parents[1]
UP = ROOT / "deploy" / "testenv" / "k8s" / "up"
TEAMS = ("vision", "language")
FLAVORS = {"a100": "a100-80g", "h100": "h100-80g"}
RACK_LABEL = "topology.isthmus.io/rack"
BENCH_LABEL = "isthmus-bench"  # on every pod of both systems
GPU = "nvidia.com/gpu"
# examples/isthmus-local.yaml's teams (kueue/queues.yaml has the same numbers)
QUOTAS = {
    "vision": {"h100-80g": {"nominal": 64, "borrowing_limit": 32, "lending_limit": 32},
               "a100-80g": {"nominal": 64, "borrowing_limit": 32}},
    "language": {"h100-80g": {"nominal": 32, "borrowing_limit": 32},
                 "a100-80g": {"nominal": 32, "lending_limit": 16}},
}


@dataclass(frozen=True)
class Gang:
    index: int
    team: str
    pool: str  # a100 | h100
    replicas: int
    gpus: int
    rack: bool  # all pods must land in one rack


@dataclass
class Run:
    system: str
    submitted: dict[int, float] = field(default_factory=dict)  # gang -> wall time
    admitted: dict[int, float] = field(default_factory=dict)
    scheduled: dict[int, float] = field(default_factory=dict)  # all pods bound
    racks: dict[int, set[str]] = field(default_factory=dict)
    allocation: list[tuple[float, float]] = field(default_factory=list)  # (t, share)
    ended: float = 0.0
    phases: Phases = field(default_factory=Phases)


def workload(n: int, seed: int) -> list[Gang]:
    rng = random.Random(seed)
    gangs = []
    for i in range(n):
        if i % 2 == 0:
            replicas, gpus = rng.randint(1, 4), 8
        else:
            replicas, gpus = rng.randint(2, 8), rng.randint(1, 4)
        gangs.append(Gang(i, TEAMS[rng.randrange(2)], rng.choice(("a100", "h100")), replicas,
                          gpus, rack=rng.random() < 0.5))
    return gangs


# -- cluster -------------------------------------------------------------------------------
def cluster() -> dict[str, str]:
    out = subprocess.run(["bash", str(UP), "--with-kueue"], capture_output=True, text=True,
                         check=True, timeout=1800, env=kueue_env()).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


class Kube:
    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def pods(self) -> list[dict[str, Any]]:
        out = []
        for ns in (f"isthmus-{t}" for t in TEAMS):
            resp = self.core.list_namespaced_pod(ns, label_selector=BENCH_LABEL,
                                                 _preload_content=False, _request_timeout=60)
            out += json.loads(resp.data).get("items") or []
        return out

    def jobs(self) -> list[dict[str, Any]]:
        out = []
        for ns in (f"isthmus-{t}" for t in TEAMS):
            resp = self.batch.list_namespaced_job(ns, _preload_content=False,
                                                  _request_timeout=60)
            out += json.loads(resp.data).get("items") or []
        return out

    def workloads(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ns in (f"isthmus-{t}" for t in TEAMS):
            out += self.custom.list_namespaced_custom_object(
                "kueue.x-k8s.io", "v1beta2", ns, "workloads", _request_timeout=60,
            ).get("items") or []
        return out

    def settle(self, names: set[str], timeout: float) -> None:
        """Wait (for the phase breakdown) until the Jobs `names` have all finished."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = [j for j in self.jobs() if j["metadata"]["name"] in names
                    and not any(c.get("type") in ("Complete", "Failed")
                                and c.get("status") == "True"
                                for c in (j.get("status") or {}).get("conditions") or ())]
            if not left:
                return
            time.sleep(2)

    def nodes(self) -> tuple[dict[str, str], int]:
        """node -> rack, and the cluster's GPUs."""
        racks, gpus = {}, 0
        for n in self.core.list_node(label_selector="type=kwok").items:
            racks[n.metadata.name] = n.metadata.labels.get(RACK_LABEL, "")
            gpus += int((n.status.allocatable or {}).get(GPU, 0))
        return racks, gpus

    def empty(self, timeout: float = 600) -> None:
        """Delete every Job in the teams' namespaces and wait for their pods to go."""
        for ns in (f"isthmus-{t}" for t in TEAMS):
            self.batch.delete_collection_namespaced_job(ns, propagation_policy="Background",
                                                        _request_timeout=120)
        deadline = time.monotonic() + timeout
        while self.pods():
            if time.monotonic() > deadline:
                raise TimeoutError("the cluster did not empty")
            time.sleep(2)


# -- measuring -----------------------------------------------------------------------------
def watch(kube: Kube, run: Run, gangs: list[Gang], gang_of: Callable[[dict[str, Any]], int | None],
          racks: dict[str, str], total_gpus: int, stall_s: float, t0: float) -> None:
    """Sample the pods until every gang is scheduled or nothing moved for `stall_s`."""
    last_change, last_count = time.monotonic(), -1
    while True:
        pods = kube.pods()
        bound_gpus = 0
        firsts: dict[int, dict[str, float]] = defaultdict(dict)
        where: dict[int, set[str]] = defaultdict(set)
        for p in pods:
            g = gang_of(p)
            node = (p.get("spec") or {}).get("nodeName")
            if g is None or not node:
                continue
            phase = (p.get("status") or {}).get("phase")
            if phase in ("Pending", "Running"):
                bound_gpus += gangs[g].gpus
            index = ((p.get("metadata") or {}).get("annotations") or {}).get(
                "batch.kubernetes.io/job-completion-index", "0")
            at = _scheduled_at(p)
            if at is not None:
                firsts[g][index] = min(firsts[g].get(index, at), at)
            where[g].add(racks.get(node, "?"))
        for g, by_index in firsts.items():
            if g not in run.scheduled and len(by_index) >= gangs[g].replicas:
                run.scheduled[g] = max(by_index.values())
                run.racks[g] = where[g]
        run.allocation.append((time.time() - t0, bound_gpus / total_gpus))
        if len(run.scheduled) != last_count:
            last_count, last_change = len(run.scheduled), time.monotonic()
        if len(run.scheduled) == len(gangs) or time.monotonic() - last_change > stall_s:
            run.ended = time.time()
            return
        time.sleep(2)


def _scheduled_at(pod: dict[str, Any]) -> float | None:
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            return ts(c.get("lastTransitionTime"))
    return None


# -- (a) Kueue -----------------------------------------------------------------------------
def kueue_job(g: Gang, duration: str) -> dict[str, Any]:
    annotations = {"isthmus.io/fake-duration": duration}
    if g.rack:
        annotations["kueue.x-k8s.io/podset-required-topology"] = RACK_LABEL
    tolerations = [{"key": "isthmus.io/pool", "operator": "Equal", "value": g.pool,
                    "effect": "NoSchedule"}]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"kueue-g{g.index}", "namespace": f"isthmus-{g.team}",
                     "labels": {"kueue.x-k8s.io/queue-name": "isthmus"}},
        "spec": {
            "suspend": True, "completions": g.replicas, "parallelism": g.replicas,
            "completionMode": "Indexed", "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {BENCH_LABEL: "kueue"}, "annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"isthmus.io/pool": g.pool},
                    "tolerations": tolerations,
                    "containers": [{"name": "trainer", "image": "registry.local/train:1.0",
                                    "command": ["sleep", "1"],
                                    "resources": {"limits": {GPU: str(g.gpus)}}}],
                },
            },
        },
    }


def run_kueue(kube: Kube, gangs: list[Gang], args: argparse.Namespace,
              racks: dict[str, str], total_gpus: int) -> Run:
    run = Run("kueue")
    t0 = time.time()

    def submit(g: Gang) -> None:
        run.submitted[g.index] = time.time()
        kube.batch.create_namespaced_job(f"isthmus-{g.team}", kueue_job(g, args.duration),
                                         _request_timeout=60)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(submit, gangs))

    def gang_of(p: dict[str, Any]) -> int | None:
        name = ((p.get("metadata") or {}).get("labels") or {}).get("job-name", "")
        return int(name[len("kueue-g"):]) if name.startswith("kueue-g") else None

    def gang_of_name(name: str) -> int | None:
        return int(name[len("kueue-g"):]) if name.startswith("kueue-g") else None

    watch(kube, run, gangs, gang_of, racks, total_gpus, args.stall, t0)
    # read twice: every gang is admitted now; Finished once they have ended
    add_workloads(run.phases, kube.workloads(), gang_of_name)
    kube.settle({f"kueue-g{g.index}" for g in gangs}, args.settle)
    add_workloads(run.phases, kube.workloads(), gang_of_name)
    run.admitted = {g: s["admitted"] for g, s in run.phases.at.items() if "admitted" in s}
    add_jobs(run.phases, kube.jobs(), lambda j: gang_of_name(j["metadata"]["name"]),
             started_is_creation=False)
    _add_common(run, kube, gangs, gang_of)
    return run


def _add_common(run: Run, kube: Kube, gangs: list[Gang],
                gang_of: Callable[[dict[str, Any]], int | None]) -> None:
    add_pods(run.phases, kube.pods(), gang_of, {g.index: g.replicas for g in gangs})
    for g, at in run.submitted.items():
        run.phases.put(g, "submitted", at)


# -- (b) Isthmus ---------------------------------------------------------------------------
def isthmus_config(path: Path, kubeconfig: str, duration: str) -> None:
    cap = {"nodes": 8, "gpus_per_node": 8, "nodes_per_rack": 4, "racks_per_block": 2}
    data = {
        "auth": {"mode": "none"},
        "control": {"admission_interval": 0.5, "dispatch_interval": 0.2,
                    "reconcile_interval": 0.5, "lease_ttl": 5.0},
        "flavors": [
            {"name": "h100-80g", "gpu_model": "NVIDIA-H100-80GB-HBM3", "gpu_memory_gb": 80,
             "cost_weight": 2.0},
            {"name": "a100-80g", "gpu_model": "NVIDIA-A100-SXM4-80GB", "gpu_memory_gb": 80},
        ],
        "backends": [{"name": "k8s-local", "kind": "k8s", "settings": {
            "kubeconfig": kubeconfig, "namespace": "isthmus-{team}",
            "pod_labels": {BENCH_LABEL: "isthmus"},
            "pod_annotations": {"isthmus.io/fake-duration": duration}}}],
        "pools": [{"name": f"k8s-{p}", "backend": "k8s-local", "flavor": f,
                   "node_selector": {"isthmus.io/pool": p}, "capacity": cap,
                   **({"shared": False} if p == "h100" else {})}
                  for p, f in FLAVORS.items()],
        "cohorts": [{"name": "research"}],
        "teams": [{"name": t, "cohort": "research", "quotas": QUOTAS[t]} for t in TEAMS],
    }
    path.write_text(yaml.safe_dump(data))


def isthmus_spec(g: Gang) -> dict[str, Any]:
    return {
        "name": f"g{g.index}", "team": g.team,
        "gang": {"replicas": g.replicas, "gpus_per_replica": g.gpus},
        "flavors": [FLAVORS[g.pool]], "topology": {"required": "rack"} if g.rack else {},
        "backend": "k8s",
        "entrypoint": {"image": "registry.local/train:1.0", "command": ["sleep", "1"]},
        "max_runtime": "30m", "retry": {"max_attempts": 3, "backoff": "1s", "max_backoff": "2s"},
    }


def run_isthmus(kube: Kube, gangs: list[Gang], args: argparse.Namespace, kubeconfig: str,
                racks: dict[str, str], total_gpus: int) -> Run:
    run = Run("isthmus")
    with tempfile.TemporaryDirectory(prefix="vs-kueue-") as tmp_name:
        tmp = Path(tmp_name)
        isthmus_config(tmp / "isthmus.yaml", kubeconfig, args.duration)
        port = _free_port()
        log = open(tmp / "server.log", "wb")  # noqa: SIM115 - closed below
        server = subprocess.Popen(
            [sys.executable, "-m", "broker.cli.main", "server", "--config",
             str(tmp / "isthmus.yaml"), "--db", f"sqlite:///{tmp / 'isthmus.db'}",
             "--port", str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        ids: dict[str, int] = {}
        try:
            _wait_up(http, server)
            t0 = time.time()

            def submit(g: Gang) -> None:
                run.submitted[g.index] = time.time()
                r = http.post("/v1/jobs", json=isthmus_spec(g))
                r.raise_for_status()
                ids[r.json()["id"]] = g.index

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(submit, gangs))

            def gang_of(p: dict[str, Any]) -> int | None:
                return ids.get(((p.get("metadata") or {}).get("labels") or {}).get(
                    "isthmus.io/job", ""))

            watch(kube, run, gangs, gang_of, racks, total_gpus, args.stall, t0)
            names = {str(j["metadata"]["name"]) for j in kube.jobs()
                     if (j["metadata"].get("labels") or {}).get("isthmus.io/job") in ids}
            kube.settle(names, args.settle)
            _isthmus_events(http, run, ids, args.settle)
            add_jobs(run.phases, kube.jobs(), lambda j: ids.get(
                (j["metadata"].get("labels") or {}).get("isthmus.io/job", "")),
                started_is_creation=True)
            _add_common(run, kube, gangs, gang_of)
        finally:
            http.close()
            server.terminate()
            server.wait(timeout=60)
            log.close()
    return run


def _isthmus_events(http: httpx.Client, run: Run, ids: dict[str, int], settle: float) -> None:
    """ADMITTED and the end of each job (its quota released) from the broker's events; waits
    up to `settle` s for the broker to see the last Jobs end."""
    deadline = time.monotonic() + settle
    for job_id, g in ids.items():
        while True:
            events = http.get(f"/v1/jobs/{job_id}/events").json()
            ends = [e for e in events if e["to_state"] in ("SUCCEEDED", "FAILED", "CANCELLED")]
            if ends or time.monotonic() > deadline:
                break
            time.sleep(1)
        for e in events:
            if e["to_state"] == "ADMITTED" and g not in run.admitted:
                run.admitted[g] = datetime.fromisoformat(e["at"]).timestamp()
                run.phases.put(g, "admitted", run.admitted[g], latest=False)
        if ends:
            run.phases.put(g, "released", datetime.fromisoformat(ends[0]["at"]).timestamp())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(http: httpx.Client, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("isthmus server exited")
        try:
            if http.get("/healthz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("isthmus server did not start")


# -- report --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Summary:
    admitted: int
    admit_rate: float
    scheduled: int
    sched_rate: float
    p50: float
    p95: float
    in_domain: float
    alloc_mean: float
    alloc_timeline: str


def summarize(run: Run, gangs: list[Gang]) -> Summary:
    first = min(run.submitted.values())
    admit_span = max(run.admitted.values(), default=first) - first
    sched_span = max(run.scheduled.values(), default=first) - first
    lat = sorted(max(0.0, run.scheduled[g] - run.submitted[g]) for g in run.scheduled)
    rack_gangs = [g.index for g in gangs if g.rack and g.index in run.scheduled]
    inside = sum(1 for g in rack_gangs if len(run.racks[g]) == 1)
    # the mean over the run until the last gang was scheduled (what the schedulers decide)
    samples = [a for t, a in run.allocation if t <= sched_span] or [a for _, a in run.allocation]
    deciles = []
    if run.allocation:
        end = run.allocation[-1][0]
        for k in range(10):
            part = [a for t, a in run.allocation if k * end / 10 <= t <= (k + 1) * end / 10]
            deciles.append(f"{100 * statistics.fmean(part):.0f}" if part else "-")
    return Summary(
        admitted=len(run.admitted), admit_rate=len(run.admitted) / max(admit_span, 1e-9),
        scheduled=len(run.scheduled), sched_rate=len(run.scheduled) / max(sched_span, 1e-9),
        p50=_q(lat, 0.5), p95=_q(lat, 0.95),
        in_domain=100.0 * inside / len(rack_gangs) if rack_gangs else 100.0,
        alloc_mean=100 * statistics.fmean(samples) if samples else 0.0,
        alloc_timeline=" ".join(deciles),
    )


def _q(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gangs", type=int, default=1000)
    ap.add_argument("--duration", default="5s", help="how long every pod runs once bound")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--stall", type=float, default=180.0,
                    help="stop when no gang got scheduled for this many seconds")
    ap.add_argument("--settle", type=float, default=120.0,
                    help="after the last gang is scheduled, wait up to this long for the "
                         "gangs to finish (for the phase breakdown; not in the rates)")
    ap.add_argument("--systems", default="kueue,isthmus",
                    help="which systems to run, in order (comma-separated)")
    args = ap.parse_args()
    values = cluster()
    kube = Kube(values["KUBECONFIG"])
    racks, total_gpus = kube.nodes()
    gangs = workload(args.gangs, args.seed)
    runs: dict[str, Run] = {}
    for system in args.systems.split(","):
        kube.empty()
        t = time.monotonic()
        runs[system] = (run_kueue(kube, gangs, args, racks, total_gpus) if system == "kueue"
                        else run_isthmus(kube, gangs, args, values["KUBECONFIG"], racks,
                                         total_gpus))
        print(f"{system} run: {time.monotonic() - t:.0f}s", flush=True)
    kube.empty()
    report(runs, gangs, args, total_gpus)


def report(runs: dict[str, Run], gangs: list[Gang], args: argparse.Namespace,
           total_gpus: int) -> None:
    rows = {name: summarize(run, gangs) for name, run in sorted(runs.items())}
    gpus = sum(g.replicas * g.gpus for g in gangs)
    seconds = _seconds(args.duration)
    print(f"{args.gangs} gangs ({gpus} GPUs requested in all, "
          f"{sum(g.rack for g in gangs)} rack-required), pods run {args.duration}, "
          f"cluster {total_gpus} GPUs; capacity bound (every GPU busy, no overhead): "
          f"{capacity_bound(gpus * seconds, total_gpus, len(gangs)):.2f} gangs/s")
    print("| system | admitted | admissions/s | all pods scheduled | scheduled/s | "
          "submit->scheduled p50 | p95 | in-domain | GPU allocation mean | "
          "allocation by tenth of the run (%) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, s in rows.items():
        print(f"| {name} | {s.admitted} | {s.admit_rate:.2f} | {s.scheduled} | "
              f"{s.sched_rate:.2f} | {s.p50:.1f} s | {s.p95:.1f} s | {s.in_domain:.0f}% | "
              f"{s.alloc_mean:.0f}% | {s.alloc_timeline} |")
    print()
    print("Per-gang phases (p50 / p95 seconds, gangs measured; object timestamps 1 s "
          "resolution):")
    for line in phase_table({name: run.phases for name, run in sorted(runs.items())}):
        print(line)
    if "isthmus" in rows and "kueue" in rows:
        a, b = rows["isthmus"], rows["kueue"]
        ratio = a.admit_rate / b.admit_rate if b.admit_rate else float("inf")
        print(f"vs-kueue: isthmus {a.admit_rate:.2f} gangs/s kueue {b.admit_rate:.2f} "
              f"gangs/s ratio {ratio:.2f} in-domain isthmus {a.in_domain:.0f}% "
              f"kueue {b.in_domain:.0f}%")


def _seconds(duration: str) -> float:
    """A Go-style duration of the bench ("3s", "1m30s", "500ms") in seconds."""
    total, number = 0.0, ""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    i = 0
    while i < len(duration):
        ch = duration[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if duration.startswith("ms", i) else ch
        total += float(number) * units[unit]
        number, i = "", i + len(unit)
    return total

if __name__ == "__main__":
    main()
