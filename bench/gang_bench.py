"""Benchmark: NVIDIA knavigator's gang-scheduling workload through Kueue and through Isthmus,
one after the other, on the real local Kubernetes control plane (issue 30, part 2).

One command (starts its own cluster, runs both systems, prints the report):

    /work/main/.venv/bin/python -m bench.gang_bench [--systems kueue,isthmus] [--down]
        [--save runs.json]      # --replay runs.json reports again from the saved observations

The workload (knavigator `resources/benchmarks/gang-scheduling/workflows/run-test.yaml`):
32 nodes x 8 GPUs; a burst of 53 gangs submitted in a fixed order, every pod taking a whole
node (8 GPUs) for 30 s, replica counts group by group (each group fills the 32 nodes exactly):
32; 16 x2; 10 x3 + 2; 8 x4; 6 x5 + 1 x2; 5 x6 + 2; 4 x7 + 2 + 1 x2; 4 x8; 3 x9 + 5.
Optimum: 9 waves, 270 s at 100% GPU occupancy.

The cluster: `deploy/testenv/k8s/up --with-kueue` with a state dir and port base of its own
(default `/tmp/isthmus-k8s-gang`, 17100; `--state`, `--port-base`), one pool `a100` of 32
identical kwok nodes (`ISTHMUS_K8S_POOLS=a100`, `ISTHMUS_K8S_NODES_PER_POOL=32`), and Kueue
v0.17.0 configured as knavigator's `config-kueue.yaml`: `waitForPodsReady` (timeout 5m,
blockAdmission, requeue by eviction time, backoff 60-3600 s; `--no-wait-for-pods-ready` leaves
it off, which recreates the cluster), a ResourceFlavor on `nvidia.com/gpu.count: "8"`, a
ClusterQueue with 8 CPUs, 36Gi, 32 pods and 256 GPUs of nominal quota, a LocalQueue.

(a) Kueue: suspended Indexed batch/v1 Jobs (completions = parallelism = replicas) with the
    `kueue.x-k8s.io/queue-name` label, pods requesting 100m CPU, 256M and 8 GPUs as
    knavigator's job template, in namespace `gang-kueue`.
(b) Isthmus: one `isthmus server` (plain mode, SQLite, one pool `k8s-a100` of 32 x 8 GPUs, one
    team with 256 GPUs of nominal quota, control intervals as bench/vs_kueue.py), the gangs
    POSTed to `/v1/jobs` in the same order (replicas N, 8 GPUs per replica), namespace
    `gang-isthmus`.

Both systems' pods run 30 s once bound (kwok, `isthmus.io/fake-duration: 30s`). The cluster is
emptied (Jobs deleted, pods gone) before each run.

Measured the same way for both, from watches on the pods, Jobs (and Kueue's Workloads), with
this process's clock at each event (sub-second; the objects' own timestamps have 1 s
resolution): makespan = first submit -> last pod end; mean GPU occupancy = GPU-seconds of
running pods / (256 GPUs x makespan); makespan / 270 s; per gang the seconds it waited while
enough nodes were free (nodes with no bound, unfinished pod of another gang >= its replicas)
between its submit and its last pod running, and where the last free stretch before its
start went: admission (Kueue: Workload `Admitted`; Isthmus: the `ADMITTED` event), dispatch
(Kueue: the Job unsuspended; Isthmus: the Job created), the Job controller (last pod
created), the scheduler (last pod bound) and kwok (last pod running).

Last line: `gang-bench: isthmus <m1> s <o1>% kueue <m2> s <o2>% optimum 270 s`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
UP = ROOT / "deploy" / "testenv" / "k8s" / "up"
DOWN = ROOT / "deploy" / "testenv" / "k8s" / "down"

# -- the workload (pure) -------------------------------------------------------------------
GROUPS: tuple[tuple[int, ...], ...] = (
    (32,),
    (16,) * 2,
    (10,) * 3 + (2,),
    (8,) * 4,
    (6,) * 5 + (1,) * 2,
    (5,) * 6 + (2,),
    (4,) * 7 + (2,) + (1,) * 2,
    (4,) * 8,
    (3,) * 9 + (5,),
)
"""knavigator's gang-scheduling run-test, group by group in submission order."""
NODES = 32
GPUS_PER_NODE = 8
RUN_S = 30.0
OPTIMUM_S = len(GROUPS) * RUN_S  # 9 waves of 30 s


def workload() -> list[int]:
    """The replica count of each gang, in submission order."""
    return [n for group in GROUPS for n in group]


# -- the metrics (pure) --------------------------------------------------------------------
@dataclass(frozen=True)
class PodRun:
    """One pod of a gang on one node: bound to it, running, ended (wall-clock seconds)."""

    gang: int
    node: str
    bound: float
    start: float
    end: float


def makespan(first_submit: float, runs: Iterable[PodRun]) -> float:
    """First submit -> last pod end."""
    return max(r.end for r in runs) - first_submit


def occupancy(runs: Iterable[PodRun], nodes: int, t0: float, t1: float) -> float:
    """Mean share of the nodes (= of the GPUs: a pod takes a whole node) running a pod over
    [t0, t1]."""
    busy = sum(max(0.0, min(r.end, t1) - max(r.start, t0)) for r in runs)
    return busy / (nodes * (t1 - t0))


@dataclass(frozen=True)
class Wait:
    started: float
    """When the gang's last pod ran."""
    with_free_nodes: float
    """Seconds between submit and start during which enough nodes were free for it."""
    ready: float
    """Start of the last stretch of enough free nodes before `started` (= `started` if none)."""


def free_wait(gang: int, replicas: int, submitted: float, runs: Sequence[PodRun],
              nodes: int) -> Wait:
    """How long `gang` waited with `replicas` nodes free: a node is taken from the moment a
    pod of another gang is bound to it until that pod ends; the gang's own pods do not count
    against it (a gang partly started waits for the rest)."""
    own = [r for r in runs if r.gang == gang]
    started = max(r.start for r in own)
    others = [r for r in runs if r.gang != gang]
    cuts = sorted({submitted, started, *(t for r in others for t in (r.bound, r.end)
                                         if submitted < t < started)})
    free = []  # per segment [a, b) of cuts: were enough nodes free all along it
    for a, b in itertools.pairwise(cuts):
        mid = (a + b) / 2
        taken = {r.node for r in others if r.bound <= mid < r.end}
        free.append((a, b, nodes - len(taken) >= replicas))
    total = sum(b - a for a, b, ok in free if ok)
    ready = started
    for a, _, ok in reversed(free):  # back from the start, while the nodes were free
        if not ok:
            break
        ready = a
    return Wait(started=started, with_free_nodes=total, ready=ready)


def idle_split(runs: Sequence[PodRun], replicas: Sequence[int], submitted: Sequence[float],
               started: Sequence[float], nodes: int, t0: float, t1: float) -> tuple[float, float]:
    """Node-seconds over [t0, t1] with no pod running on the node, split in two: while some
    waiting gang (submitted, not all its pods running yet) would have fit on the idle nodes
    (latency: admission, dispatch, the cluster's steps), and while none would (packing: the
    order, fragmentation, the tail of the run)."""
    cuts = sorted({t0, t1, *(t for r in runs for t in (r.start, r.end) if t0 < t < t1),
                   *(t for t in (*submitted, *started) if t0 < t < t1)})
    latency = packing = 0.0
    for a, b in itertools.pairwise(cuts):
        mid = (a + b) / 2
        running = [r for r in runs if r.start <= mid < r.end]
        idle = nodes - len({r.node for r in running})
        if idle <= 0:
            continue
        fits = any(submitted[g] <= mid < started[g]
                   and n - sum(1 for r in running if r.gang == g) <= idle
                   for g, n in enumerate(replicas))
        if fits:
            latency += idle * (b - a)
        else:
            packing += idle * (b - a)
    return latency, packing


PHASES = ("admission", "dispatch", "job controller", "scheduler", "kwok")
"""Where the last free stretch before a gang's start goes, in order; each ends at a mark:
admitted, Job started, last pod created, last pod bound, last pod running."""


def phase_split(ready: float, started: float, marks: Sequence[float | None]) -> list[float]:
    """Split [ready, started] at the marks (one per phase, in order, clamped into the
    interval; a missing mark takes the previous one's time): seconds per phase, summing to
    started - ready."""
    out, prev = [], ready
    for m in marks:
        at = prev if m is None else min(max(m, prev), started)
        out.append(at - prev)
        prev = at
    out[-1] += started - prev
    return out


# -- watching the cluster ------------------------------------------------------------------
@dataclass
class Seen:
    """First-seen times (this process's clock) of what the watches saw."""

    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Watcher(threading.Thread):
    """A watch on one kind in one namespace, reconnecting from the last resourceVersion."""

    def __init__(self, api: Any, list_fn: Callable[..., Any], args: tuple[Any, ...],
                 on_event: Callable[[str, dict[str, Any], float], None]) -> None:
        super().__init__(daemon=True)
        self.api, self.list_fn, self.args, self.on_event = api, list_fn, args, on_event
        self.stop = threading.Event()
        self.errors = 0

    def run(self) -> None:
        from kubernetes import watch

        rv = None
        while not self.stop.is_set():
            try:
                if rv is None:
                    listed = self.list_fn(*self.args, _request_timeout=60)
                    listed = self.api.sanitize_for_serialization(listed)
                    rv = listed["metadata"]["resourceVersion"]
                    now = time.time()
                    for obj in listed.get("items") or ():
                        self.on_event("ADDED", obj, now)
                w = watch.Watch()  # type: ignore[no-untyped-call]
                for ev in w.stream(  # type: ignore[no-untyped-call]
                        self.list_fn, *self.args, resource_version=rv, timeout_seconds=10,
                        _request_timeout=30):
                    now = time.time()
                    obj = self.api.sanitize_for_serialization(ev["object"])
                    if ev["type"] == "ERROR":
                        rv = None
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    self.on_event(ev["type"], obj, now)
                    if self.stop.is_set():
                        break
            except Exception:  # a dropped watch is retried, from a fresh list
                self.errors += 1
                rv = None
                self.stop.wait(0.5)


def pod_event(seen: Seen, gang_of: Callable[[dict[str, Any]], int | None]) -> Callable[
        [str, dict[str, Any], float], None]:
    def on(kind: str, pod: dict[str, Any], now: float) -> None:
        meta = pod.get("metadata") or {}
        gang = gang_of(pod)
        if gang is None:
            return
        with seen.lock:
            rec = seen.pods.setdefault(meta["name"], {"gang": gang, "added": now})
            node = (pod.get("spec") or {}).get("nodeName")
            phase = (pod.get("status") or {}).get("phase")
            if node and "bound" not in rec:
                rec["bound"], rec["node"] = now, node
            if phase == "Running" and "running" not in rec:
                rec["running"] = now
            if (phase in ("Succeeded", "Failed") or kind == "DELETED") and "ended" not in rec:
                rec["ended"], rec["phase"] = now, phase if kind != "DELETED" else "Deleted"
    return on


def job_event(seen: Seen, gang_of: Callable[[dict[str, Any]], int | None]) -> Callable[
        [str, dict[str, Any], float], None]:
    def on(kind: str, job: dict[str, Any], now: float) -> None:
        gang = gang_of(job)
        if gang is None:
            return
        with seen.lock:
            rec = seen.jobs.setdefault(job["metadata"]["name"], {"gang": gang, "added": now})
            if not (job.get("spec") or {}).get("suspend") and "unsuspended" not in rec:
                rec["unsuspended"] = now
    return on


def workload_event(seen: Seen) -> Callable[[str, dict[str, Any], float], None]:
    def on(kind: str, wl: dict[str, Any], now: float) -> None:
        owners = (wl.get("metadata") or {}).get("ownerReferences") or []
        job = next((o["name"] for o in owners if o.get("kind") == "Job"), None)
        if job is None:
            return
        conds = {c.get("type"): c.get("status") for c in (wl.get("status") or {}).get(
            "conditions") or ()}
        with seen.lock:
            rec = seen.workloads.setdefault(job, {"added": now, "evictions": 0})
            if conds.get("Admitted") == "True" and "admitted" not in rec:
                rec["admitted"] = now
            if conds.get("Evicted") == "True" and not rec.get("evicted_now"):
                rec["evictions"] += 1
            rec["evicted_now"] = conds.get("Evicted") == "True"
    return on


# -- cluster -------------------------------------------------------------------------------
WAIT_FOR_PODS_READY = """waitForPodsReady:
  timeout: 5m
  blockAdmission: true
  requeuingStrategy:
    timestamp: Eviction
    backoffBaseSeconds: 60
    backoffMaxSeconds: 3600"""
"""knavigator's config-kueue.yaml (its Configuration's waitForPodsReady, v1beta2 spelling)."""


def cluster_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ISTHMUS_K8S_STATE": args.state, "ISTHMUS_K8S_PORT_BASE": str(args.port_base),
        "ISTHMUS_K8S_NODES_PER_POOL": str(NODES), "ISTHMUS_K8S_POOLS": "a100",
        "ISTHMUS_KUEUE_CONFIG_EXTRA": WAIT_FOR_PODS_READY if args.wait_for_pods_ready else "",
    })
    return env


def cluster_up(args: argparse.Namespace) -> dict[str, str]:
    out = subprocess.run(["bash", str(UP), "--with-kueue"], capture_output=True, text=True,
                         timeout=3600, env=cluster_env(args))
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"deploy/testenv/k8s/up failed ({out.returncode})")
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


class Kube:
    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def ensure_namespace(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.create_namespace(
                {"metadata": {"name": name}},  # type: ignore[arg-type]
                _request_timeout=30)
        except ApiException as e:
            if e.status != 409:
                raise

    def gpu_nodes(self) -> int:
        nodes = self._json(self.core.list_node(label_selector="isthmus.io/pool=a100",
                                               _preload_content=False))
        return sum(1 for n in nodes if int(((n.get("status") or {}).get("allocatable") or {})
                                           .get("nvidia.com/gpu", 0)) == GPUS_PER_NODE)

    @staticmethod
    def _json(resp: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
        return items

    def busy_pods(self) -> int:
        """Pods bound to a node and not finished, in every namespace."""
        pods = self._json(self.core.list_pod_for_all_namespaces(_request_timeout=60,
                                                                 _preload_content=False))
        return sum(1 for p in pods if (p.get("spec") or {}).get("nodeName")
                   and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))

    def empty(self, namespaces: Iterable[str], timeout: float = 300) -> None:
        """Delete every Job of the bench's namespaces; wait until no pod is left there and no
        pod holds a node anywhere."""
        for ns in namespaces:
            self.batch.delete_collection_namespaced_job(ns, propagation_policy="Background",
                                                        _request_timeout=120)
        deadline = time.monotonic() + timeout
        while any(self._json(self.core.list_namespaced_pod(ns, _request_timeout=60,
                                                           _preload_content=False))
                  for ns in namespaces) or self.busy_pods():
            if time.monotonic() > deadline:
                raise TimeoutError("the cluster did not empty")
            time.sleep(1)

    def create(self, group: str, plural: str, body: dict[str, Any],
               namespace: str | None = None) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            if namespace:
                self.custom.create_namespaced_custom_object(group, "v1beta2", namespace,
                                                            plural, body)
            else:
                self.custom.create_cluster_custom_object(group, "v1beta2", plural, body)
        except ApiException as e:
            if e.status != 409:
                raise


# -- a run ---------------------------------------------------------------------------------
@dataclass
class Run:
    system: str
    replicas: list[int]
    submitted: dict[int, float] = field(default_factory=dict)
    admitted: dict[int, float] = field(default_factory=dict)
    seen: Seen = field(default_factory=Seen)
    watch_errors: int = 0
    evictions: int = 0


def wait_done(run: Run, timeout: float) -> None:
    """Until every gang has `replicas` pods ended Succeeded (progress every 30 s)."""
    deadline = time.monotonic() + timeout
    next_note = time.monotonic() + 30
    t0 = min(run.submitted.values())
    while True:
        with run.seen.lock:
            done: dict[int, int] = {}
            for rec in run.seen.pods.values():
                if rec.get("phase") == "Succeeded":
                    done[rec["gang"]] = done.get(rec["gang"], 0) + 1
        finished = sum(1 for g, n in enumerate(run.replicas) if done.get(g, 0) >= n)
        if finished == len(run.replicas):
            return
        if time.monotonic() > next_note:
            print(f"  {run.system}: {finished}/{len(run.replicas)} gangs done at "
                  f"{time.time() - t0:.0f} s", flush=True)
            next_note += 30
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run.system}: {finished}/{len(run.replicas)} gangs done "
                               f"after {timeout:.0f} s")
        time.sleep(0.5)


def start_watches(kube: Kube, ns: str, seen: Seen,
                  pod_gang: Callable[[dict[str, Any]], int | None],
                  job_gang: Callable[[dict[str, Any]], int | None],
                  kueue: bool) -> list[Watcher]:
    ws = [Watcher(kube.api, kube.core.list_namespaced_pod, (ns,), pod_event(seen, pod_gang)),
          Watcher(kube.api, kube.batch.list_namespaced_job, (ns,), job_event(seen, job_gang))]
    if kueue:
        ws.append(Watcher(kube.api, kube.custom.list_namespaced_custom_object,
                          ("kueue.x-k8s.io", "v1beta2", ns, "workloads"),
                          workload_event(seen)))
    for w in ws:
        w.start()
    return ws


def stop_watches(ws: list[Watcher]) -> int:
    for w in ws:
        w.stop.set()
    for w in ws:
        w.join(timeout=40)
    return sum(w.errors for w in ws)


def gang_index(name: str, prefix: str = "gang-") -> int | None:
    return int(name[len(prefix):]) if name.startswith(prefix) and name[len(prefix):].isdigit() \
        else None


# (a) Kueue
KUEUE_NS = "gang-kueue"


def kueue_setup(kube: Kube) -> None:
    kube.ensure_namespace(KUEUE_NS)
    kube.create("kueue.x-k8s.io", "resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": "gpu-node"},
        "spec": {"nodeLabels": {"nvidia.com/gpu.count": str(GPUS_PER_NODE)}}})
    kube.create("kueue.x-k8s.io", "clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "gang"},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory", "pods", "nvidia.com/gpu"],
                "flavors": [{"name": "gpu-node", "resources": [
                    {"name": "cpu", "nominalQuota": "8"},
                    {"name": "memory", "nominalQuota": "36Gi"},
                    {"name": "pods", "nominalQuota": str(NODES)},
                    {"name": "nvidia.com/gpu", "nominalQuota": str(NODES * GPUS_PER_NODE)},
                ]}],
            }],
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
        }})
    kube.create("kueue.x-k8s.io", "localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "team-queue", "namespace": KUEUE_NS},
        "spec": {"clusterQueue": "gang"}}, namespace=KUEUE_NS)
    deadline = time.monotonic() + 120
    while True:
        cq: dict[str, Any] = kube.custom.get_cluster_custom_object(  # type: ignore[assignment]
            "kueue.x-k8s.io", "v1beta2", "clusterqueues", "gang")
        conds = {c["type"]: c["status"] for c in (cq.get("status") or {}).get("conditions")
                 or ()}
        if conds.get("Active") == "True":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"ClusterQueue gang not Active: {cq.get('status')}")
        time.sleep(0.5)


def kueue_job(index: int, replicas: int) -> dict[str, Any]:
    """knavigator's gang-scheduling Job template for Kueue, created suspended (no webhook
    here to suspend it) and run 30 s by kwok."""
    res = {"cpu": "100m", "memory": "256M", "nvidia.com/gpu": str(GPUS_PER_NODE)}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"gang-{index:02d}", "namespace": KUEUE_NS,
                     "labels": {"kueue.x-k8s.io/queue-name": "team-queue"}},
        "spec": {
            "suspend": True, "completions": replicas, "parallelism": replicas,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"annotations": {"isthmus.io/fake-duration": f"{RUN_S:.0f}s"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "test", "image": "ubuntu",
                                    "imagePullPolicy": "IfNotPresent",
                                    "resources": {"limits": res, "requests": res}}],
                },
            },
        },
    }


def run_kueue(kube: Kube, args: argparse.Namespace) -> Run:
    run = Run("kueue", workload())
    kueue_setup(kube)

    def pod_gang(pod: dict[str, Any]) -> int | None:
        return gang_index(((pod.get("metadata") or {}).get("labels") or {}).get("job-name", ""))

    def job_gang(job: dict[str, Any]) -> int | None:
        return gang_index((job.get("metadata") or {}).get("name", ""))

    ws = start_watches(kube, KUEUE_NS, run.seen, pod_gang, job_gang, kueue=True)
    for i, n in enumerate(run.replicas):
        run.submitted[i] = time.time()
        kube.batch.create_namespaced_job(KUEUE_NS, kueue_job(i, n),  # type: ignore[arg-type]
                                         _request_timeout=60)
    wait_done(run, args.timeout)
    run.watch_errors = stop_watches(ws)
    for name, rec in run.seen.workloads.items():
        g = gang_index(name)
        if g is not None and "admitted" in rec:
            run.admitted[g] = rec["admitted"]
        run.evictions += rec["evictions"]
    return run


# (b) Isthmus
ISTHMUS_NS = "gang-isthmus"


HOLD_ALL = {"ordering": {"starvation_after": 0, "reservation_min_gpus": 1,
                         "max_reservations": 1000, "backfill": False}}
"""`isthmus-hold`: every gang that does not fit at once gets a starvation reservation from its
first second, with no backfill into it: an attempt at strict FIFO by configuration only (the
policy code as it is). Measured, it is not strict: a hold covers one topology domain, the one
where the gang fits soonest, and free GPUs elsewhere still go to later gangs
(docs/benchmarks.md, "knavigator gang-scheduling workload")."""


def isthmus_config(path: Path, kubeconfig: str, policies: dict[str, Any] | None = None) -> Path:
    from tests.harness.server import write_config

    backend = {"name": "k8s-local", "kind": "k8s", "settings": {
        "kubeconfig": kubeconfig, "namespace": ISTHMUS_NS,
        "pod_annotations": {"isthmus.io/fake-duration": f"{RUN_S:.0f}s"}}}
    pool = {"name": "k8s-a100", "backend": "k8s-local", "flavor": "a100-80g",
            "node_selector": {"isthmus.io/pool": "a100"},
            "capacity": {"nodes": NODES, "gpus_per_node": GPUS_PER_NODE,
                         "nodes_per_rack": NODES // 2, "racks_per_block": 2}}
    return write_config(
        path, [backend], [pool],
        control={"admission_interval": 0.5, "dispatch_interval": 0.2,
                 "reconcile_interval": 0.5, "lease_ttl": 5.0},
        teams=[{"name": "gang", "cohort": "research",
                "quotas": {"a100-80g": {"nominal": NODES * GPUS_PER_NODE}}}],
        **({"policies": policies} if policies else {}))


def isthmus_spec(index: int, replicas: int) -> dict[str, Any]:
    return {
        "name": f"gang-{index:02d}", "team": "gang",
        "gang": {"replicas": replicas, "gpus_per_replica": GPUS_PER_NODE},
        "flavors": ["a100-80g"], "backend": "k8s",
        "entrypoint": {"image": "registry.local/train:1.0", "command": ["sleep", "30"]},
        "max_runtime": "10m", "retry": {"max_attempts": 3, "backoff": "1s", "max_backoff": "2s"},
    }


def run_isthmus(kube: Kube, args: argparse.Namespace, kubeconfig: str,
                system: str = "isthmus") -> Run:
    import httpx

    from tests.harness.server import Server

    run = Run(system, workload())
    kube.ensure_namespace(ISTHMUS_NS)
    ids: dict[str, int] = {}

    def gang_of(obj: dict[str, Any]) -> int | None:
        return ids.get(((obj.get("metadata") or {}).get("labels") or {}).get(
            "isthmus.io/job", ""))

    with tempfile.TemporaryDirectory(prefix="gang-bench-") as tmp_name:
        tmp = Path(tmp_name)
        policies = HOLD_ALL if system == "isthmus-hold" else None
        server = Server(isthmus_config(tmp / "isthmus.yaml", kubeconfig, policies),
                        f"sqlite:///{tmp / 'isthmus.db'}", tmp / "server.log")
        server.start()
        http = httpx.Client(base_url=server.url, timeout=60)
        try:
            ws = start_watches(kube, ISTHMUS_NS, run.seen, gang_of, gang_of, kueue=False)
            for i, n in enumerate(run.replicas):
                run.submitted[i] = time.time()
                r = http.post("/v1/jobs", json=isthmus_spec(i, n))
                r.raise_for_status()
                ids[r.json()["id"]] = i
            wait_done(run, args.timeout)
            run.watch_errors = stop_watches(ws)
            for job_id, g in ids.items():
                for e in http.get(f"/v1/jobs/{job_id}/events").json():
                    if e["to_state"] == "ADMITTED" and g not in run.admitted:
                        run.admitted[g] = datetime.fromisoformat(e["at"]).timestamp()
        except BaseException:
            sys.stderr.write((tmp / "server.log").read_text()[-3000:])
            raise
        finally:
            http.close()
            server.stop()
            if args.keep:  # the server's log and database (its decision log), for reading
                args.keep.mkdir(parents=True, exist_ok=True)
                for name in ("server.log", "isthmus.db", "isthmus.yaml"):
                    shutil.copy(tmp / name, args.keep / f"{system}-{name}")
    return run


# -- report --------------------------------------------------------------------------------
@dataclass(frozen=True)
class GangRow:
    gang: int
    replicas: int
    submitted: float
    started: float
    waited: float
    with_free: float
    phases: list[float]


@dataclass(frozen=True)
class Summary:
    makespan: float
    occupancy: float
    rows: list[GangRow]
    pods: int
    extra_pods: int
    idle_latency: float
    """Idle node-seconds while a waiting gang would have fit (see `idle_split`)."""
    idle_packing: float
    split_gangs: list[int]
    """Gangs whose pods started more than SPLIT_S apart (not run as one gang)."""


def pod_runs(run: Run) -> list[PodRun]:
    out = []
    for rec in run.seen.pods.values():
        if "bound" in rec and "running" in rec and "ended" in rec:
            out.append(PodRun(rec["gang"], rec["node"], rec["bound"], rec["running"],
                              rec["ended"]))
    return out


SPLIT_S = 5.0


def split_gangs(runs: Iterable[PodRun], within: float = SPLIT_S) -> list[int]:
    """Gangs whose pods started more than `within` seconds apart."""
    starts: dict[int, list[float]] = {}
    for r in runs:
        starts.setdefault(r.gang, []).append(r.start)
    return sorted(g for g, ts in starts.items() if max(ts) - min(ts) > within)


def summarize(run: Run) -> Summary:
    runs = pod_runs(run)
    t0 = min(run.submitted.values())
    span = makespan(t0, runs)
    occ = occupancy(runs, NODES, t0, t0 + span)
    rows = []
    for g, n in enumerate(run.replicas):
        w = free_wait(g, n, run.submitted[g], runs, NODES)
        pods = [rec for rec in run.seen.pods.values() if rec["gang"] == g and "running" in rec]
        job = next((rec for rec in run.seen.jobs.values() if rec["gang"] == g), {})
        started_job = job.get("unsuspended") if run.system == "kueue" else job.get("added")
        marks = [run.admitted.get(g), started_job,
                 max((p["added"] for p in pods), default=None),
                 max((p["bound"] for p in pods), default=None),
                 w.started]
        rows.append(GangRow(g, n, run.submitted[g] - t0, w.started - t0,
                            w.started - run.submitted[g], w.with_free_nodes,
                            phase_split(w.ready, w.started, marks)))
    latency, packing = idle_split(runs, run.replicas, [run.submitted[g] for g in
                                                       range(len(run.replicas))],
                                  [t0 + r.started for r in rows], NODES, t0, t0 + span)
    return Summary(span, occ, rows, len(runs), len(runs) - sum(run.replicas), latency, packing,
                   split_gangs(runs))


def report(runs: dict[str, Run]) -> None:
    sums = {name: summarize(run) for name, run in runs.items()}
    print(f"knavigator gang-scheduling: {len(workload())} gangs, {sum(workload())} pods x "
          f"{GPUS_PER_NODE} GPUs x {RUN_S:.0f} s on {NODES} nodes; optimum {OPTIMUM_S:.0f} s "
          f"at 100%")
    print()
    print("| system | makespan | makespan / 270 s | mean GPU occupancy | waited with free "
          "nodes: sum / mean / max per gang | pods run | gangs whose pods started > 5 s apart | "
          "watch reconnects | Kueue evictions |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, s in sums.items():
        free = [r.with_free for r in s.rows]
        print(f"| {name} | {s.makespan:.1f} s | {s.makespan / OPTIMUM_S:.3f} | "
              f"{100 * s.occupancy:.1f}% | {sum(free):.1f} / {statistics.fmean(free):.2f} / "
              f"{max(free):.2f} s | {s.pods} | {', '.join(map(str, s.split_gangs)) or 'none'} | "
              f"{runs[name].watch_errors} | "
              f"{runs[name].evictions if name == 'kueue' else '-'} |")
    print()
    print("Idle node-seconds (no pod running) over the run, in seconds of the makespan "
          "(/ 32 nodes): while a waiting gang would have fit on the idle nodes (latency), "
          "while none would (packing: order, fragmentation, the tail):")
    print("| system | makespan - 270 s | idle, latency | idle, packing |")
    print("|---|---|---|---|")
    for name, s in sums.items():
        print(f"| {name} | {s.makespan - OPTIMUM_S:.1f} s | {s.idle_latency / NODES:.1f} s | "
              f"{s.idle_packing / NODES:.1f} s |")
    print()
    print("Where the last stretch of enough free nodes before each gang's start went "
          "(seconds, summed over the 53 gangs / mean per gang):")
    print("| system | " + " | ".join(PHASES) + " | total |")
    print("|---|" + "---|" * (len(PHASES) + 1))
    for name, s in sums.items():
        cols = [sum(r.phases[k] for r in s.rows) for k in range(len(PHASES))]
        print(f"| {name} | " + " | ".join(f"{c:.1f} / {c / len(s.rows):.2f}" for c in cols)
              + f" | {sum(cols):.1f} |")
    print()
    names = list(sums)
    print("Per gang (seconds from the first submit; waited = submit -> last pod running; "
          "free = of which with enough free nodes):")
    print("| gang | replicas | " + " | ".join(f"{n} start | {n} waited | {n} free"
                                              for n in names) + " |")
    print("|---|---|" + "---|---|---|" * len(names))
    for g, n in enumerate(workload()):
        cells = []
        for name in names:
            r = sums[name].rows[g]
            cells.append(f"{r.started:.1f} | {r.waited:.1f} | {r.with_free:.1f}")
        print(f"| {g} | {n} | " + " | ".join(cells) + " |")
    print()
    parts = []
    for name in ("isthmus", "kueue"):
        if name in sums:
            parts.append(f"{name} {sums[name].makespan:.1f} s {100 * sums[name].occupancy:.1f}%")
        else:
            parts.append(f"{name} - s -%")
    print(f"gang-bench: {' '.join(parts)} optimum {OPTIMUM_S:.0f} s")


def save(runs: dict[str, Run], path: Path) -> None:
    """The raw observations of each run (for `--replay`)."""
    data = {name: {"replicas": r.replicas, "submitted": r.submitted, "admitted": r.admitted,
                   "pods": r.seen.pods, "jobs": r.seen.jobs, "workloads": r.seen.workloads,
                   "watch_errors": r.watch_errors, "evictions": r.evictions}
            for name, r in runs.items()}
    path.write_text(json.dumps(data))


def load(path: Path) -> dict[str, Run]:
    runs = {}
    for name, d in json.loads(path.read_text()).items():
        run = Run(name, d["replicas"], {int(k): v for k, v in d["submitted"].items()},
                  {int(k): v for k, v in d["admitted"].items()},
                  watch_errors=d["watch_errors"], evictions=d["evictions"])
        run.seen.pods, run.seen.jobs, run.seen.workloads = d["pods"], d["jobs"], d["workloads"]
        runs[name] = run
    return runs


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--systems", default="kueue,isthmus",
                    help="which systems to run, in order (comma-separated): kueue, isthmus, "
                         "isthmus-hold (Isthmus with HOLD_ALL's policies)")
    ap.add_argument("--state", default="/tmp/isthmus-k8s-gang",
                    help="the cluster's state dir (its own: never the tests' clusters)")
    ap.add_argument("--port-base", type=int, default=17100)
    ap.add_argument("--no-wait-for-pods-ready", dest="wait_for_pods_ready",
                    action="store_false",
                    help="Kueue without knavigator's waitForPodsReady (recreates the cluster)")
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="give up on a system after this many seconds")
    ap.add_argument("--down", action="store_true", help="stop the cluster at the end")
    ap.add_argument("--keep", type=Path,
                    help="copy each Isthmus run's server log, database and config here")
    ap.add_argument("--save", type=Path, help="write the raw observations here (JSON)")
    ap.add_argument("--replay", type=Path,
                    help="report from observations saved by --save; runs nothing")
    args = ap.parse_args(argv)
    if args.replay:
        report(load(args.replay))
        return
    values = cluster_up(args)
    kube = Kube(values["KUBECONFIG"])
    nodes = kube.gpu_nodes()
    if nodes != NODES:
        raise SystemExit(f"expected {NODES} nodes of {GPUS_PER_NODE} GPUs, found {nodes}")
    runs: dict[str, Run] = {}
    try:
        for system in args.systems.split(","):
            kube.ensure_namespace(KUEUE_NS)
            kube.ensure_namespace(ISTHMUS_NS)
            kube.empty((KUEUE_NS, ISTHMUS_NS))
            t = time.monotonic()
            print(f"{system}: start (load average {os.getloadavg()[0]:.1f})", flush=True)
            if system not in ("kueue", "isthmus", "isthmus-hold"):
                raise SystemExit(f"unknown system {system!r}")
            runs[system] = (run_kueue(kube, args) if system == "kueue"
                            else run_isthmus(kube, args, values["KUBECONFIG"], system))
            print(f"{system}: done in {time.monotonic() - t:.0f} s (load average "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
        kube.empty((KUEUE_NS, ISTHMUS_NS))
    finally:
        if args.down:
            subprocess.run(["bash", str(DOWN)], env=cluster_env(args), check=False)
    if args.save:
        save(runs, args.save)
    report(runs)


if __name__ == "__main__":
    main()
