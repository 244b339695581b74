"""`K8sBackend`: the Backend protocol over a Kubernetes cluster.

- inventory: Nodes (from the node watch) and every non-terminal pod (one list) -> pools;
- submit: the manifests of `manifests.render`: the Secret of the progress token first, then
  the Job (which then owns the Secret), Service and PodGroup; a 409 adopts the existing
  object when its Isthmus labels match, else the request is refused. With a per-team
  namespace (`namespace: "isthmus-{team}"`) the team's namespace is created on first use and
  the watches span namespaces (label-selected); by name, a gang is found in the caches first;
- observe: facts from the Job / Pod watch caches (a direct list while they are not healthy);
  gangs that must end (all-ranks timeout, rank on a lost node, image never pulled) are torn
  down here: the Job is annotated with the verdict, then deleted, and the verdict is kept as a
  tombstone so the fact outlives the object;
- cancel: Job deleted in the foreground, pods with the given grace, Service (and PodGroup).

Nothing here turns "API server unreachable" into a job failure: it raises BackendUnavailable.
"""

from __future__ import annotations

import functools
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from backends.base import (
    BackendUnavailable,
    CancelResult,
    Capability,
    RankLog,
    SubmitRequest,
    SubmitResult,
    Unsupported,
)
from backends.k8s.classify import ClassifyPolicy, Verdict, judge, teardown_annotation
from backends.k8s.client import ApiError, Apis, call, call_json, translated
from backends.k8s.inventory import build_pools
from backends.k8s.kueue import (
    JOB_UID_LABEL,
    KUEUE_GROUP,
    WORKLOADS,
    by_job_uid,
    queue_of,
    refine,
)
from backends.k8s.manifests import (
    ANN_TEARDOWN,
    COMPLETION_INDEX,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_NAME,
    LABEL_TEAM,
    MANAGED_SELECTOR,
    PODGROUP_API,
    labels_match,
    render,
)
from backends.k8s.settings import MANAGED_BY, K8sSettings, PoolBinding
from backends.k8s.watch import Reflector
from broker.domain.facts import Fact
from broker.domain.inventory import InventorySnapshot
from broker.logs import get_logger

log = get_logger(__name__)
TOMBSTONE_TTL = timedelta(hours=6)
NON_TERMINAL = "status.phase!=Succeeded,status.phase!=Failed"
JSON = dict[str, Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


class K8sBackend:
    """Implements backends.base.Backend; see the module docstring."""

    kind = "k8s"
    capabilities = (Capability.GANG | Capability.TOPOLOGY | Capability.PREEMPT_SIGNAL
                    | Capability.QUEUE_DEPTH)

    def __init__(
        self,
        name: str,
        pools: Sequence[PoolBinding],
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
        self._namespaces_ready: set[str] = set()
        self._lock = threading.Lock()

    @property
    def namespace(self) -> str:
        """The namespace of every gang, or the template (`isthmus-{team}`) of per-team ones."""
        return self.settings.namespace

    def _namespace_of(self, name: str) -> str | None:
        """Where the gang `name` lives: the one namespace, or (per team) wherever its Job or
        pods are: the watch caches first, then one label-selected list across namespaces."""
        if not self.settings.per_team:
            return self.namespace
        for kind in ("jobs", "pods"):
            reflector = self.reflectors.get(kind)
            if reflector is None or not reflector.healthy:
                continue
            for obj in reflector.snapshot():
                meta = _meta(obj)
                if (meta.get("labels") or {}).get(LABEL_NAME) == name or (
                        kind == "jobs" and meta.get("name") == name):
                    return str(meta.get("namespace"))
        selector = f"{LABEL_NAME}={name}"
        for what, lister in (("list Jobs", self.apis.batch.list_job_for_all_namespaces),
                             ("list pods", self.apis.core.list_pod_for_all_namespaces)):
            found = call_json(what, lister, label_selector=selector, timeout=self.timeout)
            for obj in found.get("items") or ():
                return str(_meta(obj).get("namespace"))
        return None

    @property
    def timeout(self) -> float:
        return self.settings.request_timeout_s

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the watches (observe and inventory do it on first use)."""
        with self._lock:
            if self.reflectors or not self.use_watch:
                return
            self.reflectors = self._make_reflectors()
            for r in self.reflectors.values():
                r.start()

    def _make_reflectors(self) -> dict[str, Reflector]:
        ns, s = self.namespace, self.settings
        kw: dict[str, Any] = {"timeout": s.request_timeout_s,
                              "watch_timeout_s": s.watch_timeout_s,
                              "max_backoff_s": s.max_backoff_s}
        batch, core = self.apis.batch, self.apis.core
        if s.per_team:  # every team's namespace: one watch across them, by our label
            jobs: Callable[..., Any] = functools.partial(
                batch.list_job_for_all_namespaces, label_selector=MANAGED_SELECTOR)
            pods: Callable[..., Any] = functools.partial(
                core.list_pod_for_all_namespaces, label_selector=MANAGED_SELECTOR)
        else:
            jobs = functools.partial(batch.list_namespaced_job, ns,
                                     label_selector=MANAGED_SELECTOR)
            pods = functools.partial(core.list_namespaced_pod, ns,
                                     label_selector=MANAGED_SELECTOR)
        reflectors = {
            "jobs": Reflector("jobs", jobs, **kw),
            "pods": Reflector("pods", pods, **kw),
            "nodes": Reflector("nodes", core.list_node, **kw),
        }
        if self.uses_kueue:  # Kueue's Workloads (not labelled by us: all of the namespace)
            cu, version = self.apis.custom, s.kueue_api_version
            workloads: Callable[..., Any] = (
                functools.partial(cu.list_cluster_custom_object, KUEUE_GROUP, version,
                                  WORKLOADS) if s.per_team else
                functools.partial(cu.list_namespaced_custom_object, KUEUE_GROUP, version, ns,
                                  WORKLOADS))
            reflectors["workloads"] = Reflector("workloads", workloads, **kw)
        return reflectors

    @property
    def uses_kueue(self) -> bool:
        return any(self.settings.mode(p) == "kueue" for p in self.pools)

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
            reflector = self._make_reflectors()[kind]
        items, _ = reflector.list_now()
        return items

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

    def _pool(self, request: SubmitRequest) -> PoolBinding:
        pool = self.pools.get(request.placement.pool)
        if pool is None:
            raise Unsupported(f"placement.pool: backend {self.name} has no pool "
                              f"'{request.placement.pool}' (known: {sorted(self.pools)})")
        return pool

    def _ensure_namespace(self, ns: str, team: str) -> None:
        if ns in self._namespaces_ready or not self.settings.create_namespace:
            return
        labels = {LABEL_MANAGED: MANAGED_BY}
        if self.settings.per_team:
            labels[LABEL_TEAM] = team
        body = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": labels}}
        try:
            call("create namespace", self.apis.core.create_namespace, body, timeout=self.timeout)
        except ApiError as exc:
            if exc.status not in (409, 403):
                raise Unsupported(f"namespace {ns}: {exc.reason}") from None
        self._namespaces_ready.add(ns)

    def submit(self, request: SubmitRequest) -> SubmitResult:
        manifests = self.render(request)
        job = next(m for m in manifests if m["kind"] == "Job")
        ns = str(job["metadata"]["namespace"])
        self._ensure_namespace(ns, request.snapshot.spec.team)
        secrets = [m for m in manifests if m["kind"] == "Secret"]
        rest = [m for m in manifests if m["kind"] not in ("Job", "Secret")]
        for secret in secrets:  # before the Job: its pods read the token from it
            self._create(request, secret, ns)
        created, adopted_job = self._create(request, job, ns)
        uid = str(_meta(created).get("uid", ""))
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": request.name, "uid": uid,
                 "controller": False, "blockOwnerDeletion": True}
        for secret in secrets:  # owned by the Job, so the garbage collector takes it along
            call("own Secret", self.apis.core.patch_namespaced_secret,
                 secret["metadata"]["name"],
                 ns, {"metadata": {"ownerReferences": [owner]}},
                 timeout=self.timeout, _content_type="application/merge-patch+json")
        adopted = adopted_job
        for manifest in rest:
            manifest["metadata"]["ownerReferences"] = [owner]
            _, was_there = self._create(request, manifest, ns)
            adopted = adopted or was_there
        verb = "adopted" if adopted else "created"
        log.info("%s %s/%s (%s)", verb, ns, request.name, uid)
        return SubmitResult(request.name, uid, adopted=adopted)

    def _create(self, request: SubmitRequest, manifest: JSON, ns: str) -> tuple[JSON, bool]:
        kind = manifest["kind"]
        create, read = self._verbs(kind, ns)
        try:
            return call_json(f"create {kind}", create, body=manifest,
                             timeout=self.timeout), False
        except ApiError as exc:
            if exc.status != 409:
                raise Unsupported(f"{kind} {request.name}: the API server refused it: "
                                  f"{exc}") from None
        existing = call_json(f"read {kind}", read, name=request.name, timeout=self.timeout)
        labels = _meta(existing).get("labels") or {}
        if not labels_match(labels, request):
            raise Unsupported(
                f"{kind} {ns}/{request.name} already exists and is not this "
                f"attempt's (labels {dict(labels)}); delete it or pick another namespace")
        return existing, True

    def _verbs(self, kind: str, ns: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        if kind == "Job":
            b = self.apis.batch
            return (functools.partial(b.create_namespaced_job, ns),
                    functools.partial(b.read_namespaced_job, namespace=ns))
        if kind == "Service":
            c = self.apis.core
            return (functools.partial(c.create_namespaced_service, ns),
                    functools.partial(c.read_namespaced_service, namespace=ns))
        if kind == "Secret":
            c = self.apis.core
            return (functools.partial(c.create_namespaced_secret, ns),
                    functools.partial(c.read_namespaced_secret, namespace=ns))
        if kind == "PodGroup":
            group, version = PODGROUP_API.split("/")
            cu = self.apis.custom
            return (functools.partial(cu.create_namespaced_custom_object, group, version, ns,
                                      "podgroups"),
                    functools.partial(cu.get_namespaced_custom_object, group, version, ns,
                                      "podgroups"))
        raise Unsupported(f"cannot create a {kind}")

    # -- observe --------------------------------------------------------------------------
    def observe(self, names: Sequence[str] | None = None) -> list[Fact]:
        jobs = self._objects("jobs")
        pods = self._objects("pods")
        now = self.clock()
        by_job: dict[str, list[JSON]] = defaultdict(list)
        for pod in pods:
            by_job[str((_meta(pod).get("labels") or {}).get(LABEL_NAME, ""))].append(pod)
        lost = self._lost_nodes(pods)
        workloads = self._workloads() if self.uses_kueue else {}
        facts: list[Fact] = []
        seen: set[str] = set()
        for job in jobs:
            name = str(_meta(job).get("name", ""))
            verdict = judge(job, by_job.get(name, ()), now, self.policy, lost)
            if queue_of(job):  # sent to Kueue: its Workload has a say
                workload = workloads.get(str(_meta(job).get("uid", "")))
                verdict = refine(job, workload, verdict, now)
            fact = self._fact(job, verdict, now, by_job.get(name, ()))
            if verdict.teardown:
                self._teardown(job, verdict, fact)
            facts.append(fact)
            seen.add(name)
        self._prune_tombstones(now)
        facts.extend(f for n, f in self._tombstones.items() if n not in seen)
        return facts

    def logs(self, name: str, rank: int | None = None,
             tail: int | None = None) -> list[RankLog]:
        """Each rank's pod log (read_namespaced_pod_log), the rank from the pod's completion
        index. A node that serves no logs (a fake kwok node has no kubelet to ask) gives an
        empty log with the API server's answer as the note, never an error for the others."""
        ns = self._namespace_of(name)
        if ns is None:
            return []
        pods = call_json("list pods", self.apis.core.list_namespaced_pod, ns,
                         label_selector=f"{LABEL_NAME}={name}", timeout=self.timeout)
        out: list[RankLog] = []
        for pod in pods.get("items") or ():
            meta = _meta(pod)
            marks = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
            index = marks.get(COMPLETION_INDEX)
            r = int(index) if isinstance(index, str) and index.isdigit() else None
            if rank is not None and r != rank:
                continue
            pod_name = str(meta.get("name", ""))
            kw: dict[str, Any] = {"tail_lines": tail} if tail is not None else {}
            try:
                with translated("read pod log"):
                    resp = self.apis.core.read_namespaced_pod_log(
                        pod_name, ns, _preload_content=False,
                        _request_timeout=self.timeout, **kw)
                    text = resp.data.decode("utf-8", errors="replace") if resp.data else ""
                out.append(RankLog(r, text, f"pod {ns}/{pod_name}"))
            except (ApiError, BackendUnavailable) as exc:
                node = (pod.get("spec") or {}).get("nodeName") or "no node yet"
                out.append(RankLog(r, "", f"pod {ns}/{pod_name}",
                                   f"no log from node {node}: {exc}"))
        return sorted(out, key=lambda x: (x.rank is None, x.rank or 0, x.source))

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
        verdict = judge(job, items, now, self.policy)
        if queue_of(job) and self.uses_kueue:
            verdict = refine(job, self._workload_of(job), verdict, now)
        return self._fact(job, verdict, now, items)

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
        meta = _meta(job)
        found = call_json("list Workloads", self.apis.custom.list_namespaced_custom_object,
                          KUEUE_GROUP, self.settings.kueue_api_version,
                          str(meta.get("namespace")), WORKLOADS, timeout=self.timeout,
                          label_selector=f"{JOB_UID_LABEL}={meta.get('uid', '')}")
        return by_job_uid(found.get("items") or ()).get(str(meta.get("uid", "")))

    def _ran_with(self, pods: Sequence[Mapping[str, Any]],
                  nodes: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(image IDs the ranks' containers report, GPU models of the nodes they run on)."""
        ids = {str(cs["imageID"]) for p in pods
               for cs in (p.get("status") or {}).get("containerStatuses") or ()
               if cs.get("name") == self.settings.container_name and cs.get("imageID")}
        models: set[str] = set()
        if nodes:
            wanted = set(nodes)
            for node in self._objects("nodes"):
                meta = _meta(node)
                model = (meta.get("labels") or {}).get(self.settings.gpu_product_label)
                if meta.get("name") in wanted and model:
                    models.add(str(model))
        return tuple(sorted(ids)), tuple(sorted(models))

    def _fact(self, job: Mapping[str, Any], v: Verdict, now: datetime,
              pods: Sequence[Mapping[str, Any]] = ()) -> Fact:
        meta = _meta(job)
        image_ids, gpu_models = self._ran_with(pods, v.nodes)
        labels = meta.get("labels") or {}
        attempt = labels.get(LABEL_ATTEMPT)
        return Fact(
            backend=self.name, backend_name=str(meta.get("name", "")),
            backend_id=str(meta.get("uid", "")) or None, job_id=labels.get(LABEL_JOB),
            attempt=int(attempt) if attempt and str(attempt).isdigit() else None,
            phase=v.phase, reason=v.reason, failure=v.failure, raw_state=v.raw_state,
            raw_reason=v.raw_reason, message=v.message, exit_code=v.exit_code,
            signal=v.signal, nodes=v.nodes, bad_nodes=v.bad_nodes,
            submitted_at=v.submitted_at, started_at=v.started_at, ended_at=v.ended_at,
            observed_at=now, image_ids=image_ids, gpu_models=gpu_models,
        )

    def _lost_nodes(self, pods: Sequence[Mapping[str, Any]]) -> frozenset[str]:
        """Nodes that Isthmus ranks are bound to and that no longer exist (checked by name:
        a node cache lagging behind a new node must not kill a gang)."""
        used = {str(p["spec"]["nodeName"]) for p in pods
                if (p.get("spec") or {}).get("nodeName")
                and (p.get("status") or {}).get("phase") in ("Pending", "Running")}
        if not used:
            return frozenset()
        known = {str(_meta(n).get("name")) for n in self._objects("nodes")}
        lost = set()
        for node in sorted(used - known):
            try:
                call("read node", self.apis.core.read_node, node, timeout=self.timeout)
            except ApiError as exc:
                if exc.status == 404:
                    lost.add(node)
        return frozenset(lost)

    def _teardown(self, job: Mapping[str, Any], v: Verdict, fact: Fact) -> None:
        """Stop a gang that cannot go on; the annotation makes the verdict durable."""
        meta = _meta(job)
        name = str(meta.get("name", ""))
        ns = str(meta.get("namespace") or self.namespace)
        failure = v.failure or fact.failure
        assert failure is not None
        self._tombstones[name] = fact.model_copy(update={"raw_state": "TornDown"})
        if meta.get("deletionTimestamp"):
            return
        if not (meta.get("annotations") or {}).get(ANN_TEARDOWN):
            note = teardown_annotation(failure, v.raw_reason, v.message)
            try:
                call("annotate Job", self.apis.batch.patch_namespaced_job, name,
                     ns, {"metadata": {"annotations": {ANN_TEARDOWN: note}}},
                     timeout=self.timeout, _content_type="application/merge-patch+json")
            except ApiError as exc:
                if exc.status == 404:
                    return
                raise
            log.warning("tearing down %s/%s: %s", ns, name, note)
        self._delete(name, grace=None, ns=ns)

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
        pods = call_json("list pods", self.apis.core.list_namespaced_pod, ns,
                         label_selector=f"{LABEL_NAME}={name}", timeout=self.timeout)
        running = [p for p in pods.get("items") or ()
                   if (p.get("status") or {}).get("phase") == "Running"]
        found = self._delete(name, grace=grace_seconds, ns=ns)
        found = found or bool(pods.get("items"))
        signalled = found and grace_seconds > 0 and bool(running)
        if not found:
            msg = f"{ns}/{name} not found"
        else:
            msg = (f"deleted Job {ns}/{name}; {len(running)} running rank(s) "
                   f"stopped with {grace_seconds}s grace")
        return CancelResult(name, found=found, signalled=signalled, message=msg)

    def _delete(self, name: str, grace: int | None, ns: str) -> bool:
        """Delete the Job (foreground), its pods (with `grace` when given), the Service,
        Secret and PodGroup. True when the Job existed."""
        t = self.timeout
        found = True
        extra: dict[str, Any] = {} if grace is None else {"grace_period_seconds": grace}
        try:
            call("delete Job", self.apis.batch.delete_namespaced_job, name, ns, timeout=t,
                 propagation_policy="Foreground", **extra)
        except ApiError as exc:
            if exc.status != 404:
                raise
            found = False
        if grace is not None:
            call("delete pods", self.apis.core.delete_collection_namespaced_pod, ns,
                 label_selector=f"{LABEL_NAME}={name}", timeout=t, grace_period_seconds=grace)
        for what, delete in (("Service", self.apis.core.delete_namespaced_service),
                             ("Secret", self.apis.core.delete_namespaced_secret)):
            try:  # the Secret is the Job's too; deleted here as well, not left to the GC
                call(f"delete {what}", delete, name, ns, timeout=t)
            except ApiError as exc:
                if exc.status != 404:
                    raise
        if any(self.settings.mode(p) == "volcano" for p in self.pools):
            group, version = PODGROUP_API.split("/")
            try:
                call("delete PodGroup", self.apis.custom.delete_namespaced_custom_object,
                     group, version, ns, "podgroups", name, timeout=t)
            except ApiError as exc:
                if exc.status != 404:
                    raise
        return found

