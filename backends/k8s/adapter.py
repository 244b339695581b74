"""`K8sBackend`: the Backend protocol over a Kubernetes cluster. Each concern has its module:

- inventory: Nodes (from the node watch) and every non-terminal pod (one list) -> pools
  (inventory.py);
- submit: the manifests of `manifests.render`, created in order by create.py (the Secret of
  the progress token first, then the Job, which then owns the Secret, Service and PodGroup; a
  409 adopts the existing object when its Isthmus labels match, else the request is refused).
  With a per-team namespace (`namespace: "isthmus-{team}"`) the team's namespace is created on
  first use and the watches span namespaces (label-selected); by name, a gang is found in the
  caches first;
- observe: facts from the Job / Pod watch caches (a direct list while they are not healthy;
  observe.py) of the gangs asked about and of every unfinished one, each judged by
  classify.py (and kueue.py); finished gangs nobody asks about leave the caches (forget.py);
  gangs that must end (all-ranks timeout, rank on a lost node, image never pulled) are torn
  down here (teardown.py): the Job is annotated with the finding, then deleted, and the fact
  is kept as a tombstone so that it outlives the object;
- cancel: Job deleted in the foreground, pods with the given grace, Service (and PodGroup)
  (teardown.py); logs: each rank's pod log (logs.py).

Nothing here turns "API server unreachable" into a job failure: it raises BackendUnavailable.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from backends.base import (
    CancelResult,
    RankLog,
    SubmitRequest,
    SubmitResult,
    Unsupported,
)
from backends.k8s.classify import judge
from backends.k8s.client import ApiError, Apis, call_json
from backends.k8s.create import create_gang, ensure_namespace
from backends.k8s.forget import KEEP_AT_LEAST, Forgotten, pod_finished, select
from backends.k8s.inventory import build_pools
from backends.k8s.kueue import JOB_UID_LABEL, KUEUE_GROUP, WORKLOADS, by_job_uid, queue_of, refine
from backends.k8s.logs import read_logs
from backends.k8s.manifests import LABEL_NAME, render
from backends.k8s.observe import (
    gang_fact,
    gang_of,
    lost_nodes,
    make_reflectors,
    meta_of,
    pods_by_gang,
)
from backends.k8s.pod_evidence import ClassifyPolicy
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from backends.k8s.teardown import cancel_gang, tear_down
from backends.k8s.watch import Reflector, key_of
from broker.domain.facts import Fact, Finding
from broker.domain.inventory import InventorySnapshot

TOMBSTONE_TTL = timedelta(hours=6)
NON_TERMINAL = "status.phase!=Succeeded,status.phase!=Failed"
JSON = dict[str, Any]


class K8sBackend:
    """Implements backends.base.Backend; see the module docstring."""

    kind = "k8s"
    def __init__(
        self,
        name: str,
        pools: Sequence[K8sPoolBinding],
        settings: K8sSettings | None = None,
        *,
        api_client: Any | None = None,
        clock: Callable[[], datetime] | None = None,
        watch: bool = True,
    ) -> None:
        self.name = name
        self.settings = settings or K8sSettings()
        self.pools = {p.name: p for p in pools}
        self.apis = Apis(self.settings, api_client)
        self.clock = clock or (lambda: datetime.now(UTC))
        self.policy = ClassifyPolicy(
            oom_is_user_error=self.settings.oom_is_user_error,
            image_pull_timeout_s=self.settings.image_pull_timeout_s,
            all_ranks_timeout_s=self.settings.all_ranks_timeout_s,
        )
        self.use_watch = watch
        self.reflectors: dict[str, Reflector] = {}
        self._tombstones: dict[str, Fact] = {}
        # finished gangs dropped from the caches; per team, kept as long as the Job lives
        # for `_namespace_of` (forget.py)
        ttl = self.settings.ttl_after_finished_s
        self._forgotten = Forgotten(
            (None if ttl is None else timedelta(seconds=ttl)) if self.settings.per_team
            else KEEP_AT_LEAST)
        self._namespaces_ready: set[str] = set()
        self._lock = threading.Lock()
        self._on_change: Callable[[], None] | None = None

    @property
    def namespace(self) -> str:
        """The namespace of every gang, or the template (`isthmus-{team}`) of per-team ones."""
        return self.settings.namespace

    def _namespace_of(self, name: str) -> str | None:
        """Where the gang `name` lives: the one namespace, or (per team) wherever its Job or
        pods are: the watch caches first, then one label-selected list across namespaces.
        When both watches are healthy their caches answer alone: every object of ours is in
        them once the watches have listed, and one created since by another replica that
        the watch has not shown yet is adopted by `create_gang` on its 409. This spares the
        dispatch of each new gang two cluster-wide lists."""
        if not self.settings.per_team:
            return self.namespace
        forgotten = self._forgotten.namespace(name)  # no longer in the caches
        if forgotten is not None:
            return forgotten
        healthy = 0
        for kind in ("jobs", "pods"):
            reflector = self.reflectors.get(kind)
            if reflector is None or not reflector.healthy:
                continue
            healthy += 1
            for obj in reflector.snapshot():
                meta = meta_of(obj)
                if (meta.get("labels") or {}).get(LABEL_NAME) == name or (
                        kind == "jobs" and meta.get("name") == name):
                    return str(meta.get("namespace"))
        if healthy == 2:
            return None
        selector = f"{LABEL_NAME}={name}"
        for what, lister in (("list Jobs", self.apis.batch.list_job_for_all_namespaces),
                             ("list pods", self.apis.core.list_pod_for_all_namespaces)):
            found = call_json(what, lister, label_selector=selector, timeout=self.timeout)
            for obj in found.get("items") or ():
                return str(meta_of(obj).get("namespace"))
        return None

    @property
    def timeout(self) -> float:
        return self.settings.request_timeout_s

    @property
    def uses_kueue(self) -> bool:
        return any(self.settings.mode(p) == "kueue" for p in self.pools)

    @property
    def uses_volcano(self) -> bool:
        return any(self.settings.mode(p) == "volcano" for p in self.pools)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the watches (observe and inventory do it on first use)."""
        with self._lock:
            if self.reflectors or not self.use_watch:
                return
            self.reflectors = make_reflectors(self.apis, self.uses_kueue)
            for kind, r in self.reflectors.items():
                if kind != "nodes":
                    r.on_change = self._on_change
                r.start()

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback` whenever a gang's Job or pods (or its Kueue Workload) change, from
        the watch threads: e.g. to run the reconciler at once when a gang ends, instead of at
        its next interval. Does not start the watches: the first observe (or inventory)
        does, so that a replica that never leads the control loop holds no caches (only
        observe(names) forgets finished gangs; a follower's caches would grow for a week)."""
        self._on_change = callback
        for kind, reflector in self.reflectors.items():
            if kind != "nodes":
                reflector.on_change = callback

    def close(self) -> None:
        for r in self.reflectors.values():
            r.stop()
        self.reflectors = {}
        self.apis.close()

    def _objects(self, kind: str) -> list[JSON]:
        """The cached objects of a kind, or a direct list while the watch is not healthy."""
        self.start()
        reflector = self.reflectors.get(kind)
        if reflector is not None and reflector.healthy:
            return reflector.snapshot()
        if reflector is None:  # watches off: list through a throwaway reflector
            reflector = make_reflectors(self.apis, self.uses_kueue)[kind]
        items, _ = reflector.list_now()
        return items

    def _nodes(self) -> list[JSON]:
        return self._objects("nodes")

    # -- inventory ------------------------------------------------------------------------
    def inventory(self) -> InventorySnapshot:
        nodes = self._objects("nodes")
        pods = call_json("list pods", self.apis.core.list_pod_for_all_namespaces,
                         timeout=self.timeout, field_selector=NON_TERMINAL)
        pools = build_pools(self.name, nodes, list(pods.get("items") or ()),
                            list(self.pools.values()), self.settings)
        return InventorySnapshot(taken_at=self.clock(), pools=pools)

    # -- submit ---------------------------------------------------------------------------
    def render(self, request: SubmitRequest) -> list[JSON]:
        return render(request, self._pool(request), self.settings)

    def _pool(self, request: SubmitRequest) -> K8sPoolBinding:
        pool = self.pools.get(request.placement.pool)
        if pool is None:
            raise Unsupported(f"placement.pool: backend {self.name} has no pool "
                              f"'{request.placement.pool}' (known: {sorted(self.pools)})")
        return pool

    def submit(self, request: SubmitRequest) -> SubmitResult:
        manifests = self.render(request)
        job = next(m for m in manifests if m["kind"] == "Job")
        ensure_namespace(self.apis, self._namespaces_ready, str(job["metadata"]["namespace"]),
                         request.snapshot.spec.team)
        return create_gang(self.apis, request, manifests)

    # -- observe --------------------------------------------------------------------------
    def observe(self, names: Sequence[str] | None = None) -> list[Fact]:
        """Facts of the gangs in `names` and of every Job not finished (orphan detection
        needs those), or of every Job when `names` is None; finished gangs nobody asks
        about leave the caches (forget.py). A gang asked about that was forgotten is read
        directly."""
        jobs = self._objects("jobs")
        pods = self._objects("pods")
        now = self.clock()
        wanted = None if names is None else set(names)
        grace = timedelta(seconds=self.settings.forget_finished_after_s)
        # asked about again after it was forgotten: read directly below, as the caches may
        # hold a part of it only
        again = {n for n in wanted if n in self._forgotten} if wanted else set()
        for name in again:
            self._forgotten.touch(name, now)
        chosen = select(jobs, wanted, now, grace, skip=again)
        gangs = {str(meta_of(j).get("name", "")) for j in chosen.judge}
        by_job = pods_by_gang(pods, gangs)
        nodes = functools.cache(self._nodes)  # listed at most once per call, not per gang
        lost = lost_nodes(self.apis, [p for ps in by_job.values() for p in ps], nodes)
        workloads = self._workloads() if self.uses_kueue else {}
        facts: list[Fact] = []
        for job in chosen.judge:
            name = str(meta_of(job).get("name", ""))
            finding = judge(job, by_job.get(name, ()), now, self.policy, lost)
            if queue_of(job):  # sent to Kueue: its Workload has a say
                workload = workloads.get(str(meta_of(job).get("uid", "")))
                finding = refine(job, workload, finding, now)
            fact = gang_fact(self.apis, self.name, job, finding, now, by_job.get(name, ()),
                             nodes)
            if finding.teardown:
                self._teardown(job, finding, fact)
            facts.append(fact)
        if wanted is not None:
            self._forget(chosen.forget, pods, wanted, now)
            for name in sorted(again - self._tombstones.keys()):
                found = self.lookup(name)  # never "missing" for having been forgotten
                if found is not None:
                    facts.append(found)
                    gangs.add(name)
        self._prune_tombstones(now)
        facts.extend(f for n, f in self._tombstones.items() if n not in gangs)
        return facts

    def _forget(self, jobs: Sequence[JSON], pods: Sequence[JSON], wanted: set[str],
                now: datetime) -> None:
        """Drop finished unasked gangs (`jobs`) from the caches, with their pods and any
        pod of a gang forgotten earlier that the watch showed since (forget.py)."""
        for job in jobs:
            meta = meta_of(job)
            self._forgotten.note(str(meta.get("name", "")),
                                 str(meta.get("namespace") or self.namespace), now)
        self._forgotten.prune(now)
        job_cache, pod_cache = self.reflectors.get("jobs"), self.reflectors.get("pods")
        if job_cache is not None and jobs:
            job_cache.forget([key_of(j) for j in jobs])
        workloads = self.reflectors.get("workloads")  # Kueue's, owned by the Jobs
        if workloads is not None and jobs:
            uids = {str(meta_of(j).get("uid", "")) for j in jobs}
            workloads.forget([key_of(w) for uid, w in by_job_uid(workloads.snapshot()).items()
                              if uid in uids])
        if pod_cache is not None:
            # pods of gangs forgotten now or before, and finished pods of a gang that has no
            # Job in the cache any more (a pod-only re-list after the name's entry expired)
            # (only while the Job cache is healthy: an empty one knows of no Job)
            kept = ({str(meta_of(j).get("name", "")) for j in job_cache.snapshot()}
                    if job_cache is not None and job_cache.healthy else None)
            pod_cache.forget([key_of(p) for p in pods if (g := gang_of(p)) not in wanted and (
                g in self._forgotten
                or (kept is not None and g not in kept and pod_finished(p)))])

    def logs(self, name: str, rank: int | None = None,
             tail: int | None = None) -> list[RankLog]:
        """Each rank's pod log (logs.read_logs)."""
        ns = self._namespace_of(name)
        if ns is None:
            return []
        return read_logs(self.apis, ns, name, rank, tail)

    def lookup(self, name: str) -> Fact | None:
        ns = self._namespace_of(name)
        if ns is None:
            return self._tombstones.get(name)
        try:
            job = call_json("read Job", self.apis.batch.read_namespaced_job, name,
                            ns, timeout=self.timeout)
        except ApiError as exc:
            if exc.status == 404:
                return self._tombstones.get(name)
            raise
        pods = call_json("list pods", self.apis.core.list_namespaced_pod, ns,
                         label_selector=f"{LABEL_NAME}={name}", timeout=self.timeout)
        now = self.clock()
        items = pods.get("items") or ()
        finding = judge(job, items, now, self.policy)
        if queue_of(job) and self.uses_kueue:
            finding = refine(job, self._workload_of(job), finding, now)
        return gang_fact(self.apis, self.name, job, finding, now, items, self._nodes)

    def _workloads(self) -> dict[str, Mapping[str, Any]]:
        """Kueue's Workloads by Job uid; none when Kueue is not installed (404): the Jobs then
        say that no Workload was made for them."""
        try:
            return by_job_uid(self._objects("workloads"))
        except ApiError as exc:
            if exc.status != 404:
                raise
            return {}

    def _workload_of(self, job: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The Kueue Workload of one Job, read directly (lookup)."""
        meta = meta_of(job)
        found = call_json("list Workloads", self.apis.custom.list_namespaced_custom_object,
                          KUEUE_GROUP, self.settings.kueue_api_version,
                          str(meta.get("namespace")), WORKLOADS, timeout=self.timeout,
                          label_selector=f"{JOB_UID_LABEL}={meta.get('uid', '')}")
        return by_job_uid(found.get("items") or ()).get(str(meta.get("uid", "")))

    def _teardown(self, job: Mapping[str, Any], finding: Finding, fact: Fact) -> None:
        """Stop a gang that cannot go on; its fact is kept as a tombstone."""
        meta = meta_of(job)
        name = str(meta.get("name", ""))
        self._tombstones[name] = fact.model_copy(update={"raw_state": "TornDown"})
        tear_down(self.apis, job, finding, fact, str(meta.get("namespace") or self.namespace),
                  self.uses_volcano)

    def _prune_tombstones(self, now: datetime) -> None:
        for name, fact in list(self._tombstones.items()):
            if now - fact.observed_at > TOMBSTONE_TTL:
                del self._tombstones[name]

    # -- cancel ---------------------------------------------------------------------------
    def cancel(self, name: str, grace_seconds: int) -> CancelResult:
        self._tombstones.pop(name, None)
        ns = self._namespace_of(name)
        if ns is None:
            return CancelResult(name, found=False, signalled=False,
                                message=f"{name} not found in any team's namespace")
        return cancel_gang(self.apis, name, grace_seconds, ns, self.uses_volcano)
