"""`K8sBackend.observe(names)` forgets finished gangs nobody asks about (backends/k8s/forget.py):
their Job and pods leave the watch caches and get no fact; asked gangs and unfinished ones
(orphan detection) still do; a forgotten gang asked about again, its logs, lookup and cancel
(per-team namespaces too) are read from the API. Over a fake API server and caches filled from
it, with a fixed clock."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from backends.k8s import K8sBackend, K8sSettings
from backends.k8s.manifests import LABEL_NAME
from broker.domain.facts import Phase
from tests.harness.k8s_gangs import POOL, Listing, ago, filled, gang
from tests.harness.kube_objects import gpu_node

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
JSON = dict[str, Any]


class Body:
    def __init__(self, data: bytes) -> None:
        self.data = data


class FakeApi:
    """The API server's Jobs and pods, answering the calls lookup, logs and cancel make
    (as batch and core API at once); counts every call by method."""

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], JSON] = {}
        self.pods: list[JSON] = []
        self.calls: Counter[str] = Counter()

    def add(self, job: JSON, pods: list[JSON]) -> None:
        self.jobs[(job["metadata"]["namespace"], job["metadata"]["name"])] = job
        self.pods.extend(pods)

    def __getattr__(self, method: str) -> Any:
        if method.startswith("delete"):
            return lambda *a, **kw: self.calls.update([method])
        raise AttributeError(method)

    def read_namespaced_job(self, name: str, ns: str, **kw: Any) -> Body:
        self.calls.update(["read_namespaced_job"])
        if (ns, name) not in self.jobs:
            raise ApiException(status=404, reason="Not Found")
        return Body(json.dumps(self.jobs[(ns, name)]).encode())

    def list_namespaced_pod(self, ns: str, label_selector: str = "", **kw: Any) -> Listing:
        self.calls.update(["list_namespaced_pod"])
        _, _, name = label_selector.partition("=")
        return Listing(p for p in self.pods if p["metadata"]["namespace"] == ns
                       and p["metadata"]["labels"].get(LABEL_NAME) == name)

    def read_namespaced_pod_log(self, pod: str, ns: str, **kw: Any) -> Body:
        self.calls.update(["read_namespaced_pod_log"])
        return Body(f"log of {pod}\n".encode())

    def list_job_for_all_namespaces(self, **kw: Any) -> Listing:
        self.calls.update(["list_job_for_all_namespaces"])
        return Listing(self.jobs.values())

    def list_pod_for_all_namespaces(self, **kw: Any) -> Listing:
        self.calls.update(["list_pod_for_all_namespaces"])
        return Listing(self.pods)


class World:
    """A backend whose caches were listed from `api`, and its clock."""

    def __init__(self, per_team: bool = False) -> None:
        self.now = NOW
        self.api = FakeApi()
        self.names: dict[str, str] = {}
        self.per_team = per_team

    def gang(self, key: str, finished_min_ago: float | None, team: str = "vision") -> str:
        ns = f"isthmus-{team}" if self.per_team else "isthmus"
        finished = None if finished_min_ago is None else ago(NOW, finished_min_ago * 60)
        job, pods = gang(f"0t{key:0>14}", namespace=ns, started=ago(NOW, 3600),
                         finished=finished, team=team)
        self.api.add(job, pods)
        self.names[key] = job["metadata"]["name"]
        return str(job["metadata"]["name"])

    def backend(self, **settings: Any) -> K8sBackend:
        b = K8sBackend("k8s", [POOL], K8sSettings.from_dict(
            {"namespace": "isthmus-{team}" if self.per_team else "isthmus", **settings}),
            clock=lambda: self.now)
        b.apis._core = b.apis._batch = self.api
        b.reflectors = {
            "jobs": filled("jobs", self.api.jobs.values()),
            "pods": filled("pods", self.api.pods),
            "nodes": filled("nodes", [gpu_node(f"h100-node-{i}", "h100", "r0")
                                      for i in range(2)]),
        }
        return b


def cached(b: K8sBackend, kind: str) -> set[str]:
    """The gangs the `kind` cache holds objects of."""
    key = "name" if kind == "jobs" else None
    return {str(o["metadata"]["name"] if key else o["metadata"]["labels"][LABEL_NAME])
            for o in b.reflectors[kind].snapshot()}


def named(facts: Any) -> dict[str, Phase]:
    return {f.backend_name: f.phase for f in facts}


def test_finished_unasked_gangs_are_forgotten_asked_and_unfinished_are_not() -> None:
    w = World()
    old, asked, running, recent = (w.gang("old", 10), w.gang("asked", 10),
                                   w.gang("running", None), w.gang("recent", 1))
    b = w.backend()
    facts = named(b.observe([asked]))
    # asked: judged; running and not asked: judged (an orphan would be cancelled); finished
    # and not asked: no fact
    assert facts == {asked: Phase.SUCCEEDED, running: Phase.RUNNING}
    assert cached(b, "jobs") == cached(b, "pods") == {asked, running, recent}
    assert old in b._forgotten
    # without names: every Job still in the caches, as before
    assert set(named(b.observe())) == {asked, running, recent}


def test_the_grace_keeps_a_recently_finished_gang_cached() -> None:
    """A pass whose names were read before a dispatch must not forget a gang that just
    finished: it stays cached until it has been finished for the grace."""
    w = World()
    recent = w.gang("recent", 4)
    b = w.backend()
    b.observe([])
    assert cached(b, "jobs") == {recent}
    w.now = NOW + timedelta(minutes=1, seconds=1)
    b.observe([])
    assert cached(b, "jobs") == cached(b, "pods") == set()


def test_a_forgotten_gang_asked_about_again_is_read_not_missing() -> None:
    w = World()
    old = w.gang("old", 10)
    b = w.backend()
    b.observe([])
    assert cached(b, "jobs") == set()
    facts = named(b.observe([old]))
    assert facts == {old: Phase.SUCCEEDED}  # missing would make the reconciler call it LOST
    assert w.api.calls["read_namespaced_job"] == 1


def test_objects_shown_again_by_the_watch_or_a_relist_are_forgotten_again() -> None:
    w = World()
    old = w.gang("old", 10)
    b = w.backend()
    b.observe([])
    job = next(iter(w.api.jobs.values()))
    pods_cache = b.reflectors["pods"]
    pods_cache._apply({"type": "MODIFIED", "object": json.loads(json.dumps(w.api.pods[0]))})
    b.reflectors["jobs"]._apply({"type": "MODIFIED", "object": json.loads(json.dumps(job))})
    assert cached(b, "jobs") == cached(b, "pods") == {old}
    assert named(b.observe([])) == {}
    assert cached(b, "jobs") == cached(b, "pods") == set()
    b.reflectors["jobs"].relist()  # 410 Gone: all of them back, once
    pods_cache.relist()
    assert cached(b, "jobs") == {old}
    b.observe([])
    assert cached(b, "jobs") == cached(b, "pods") == set()


@pytest.mark.parametrize("per_team", [True, False], ids=["per-team", "one-namespace"])
def test_logs_lookup_and_cancel_of_a_forgotten_gang(per_team: bool) -> None:
    w = World(per_team)
    old = w.gang("old", 10, team="nlp")
    b = w.backend()
    b.observe([])
    assert cached(b, "jobs") == set()
    logs = b.logs(old)
    assert [x.rank for x in logs] == [0, 1]
    ns = "isthmus-nlp" if per_team else "isthmus"
    assert all(x.text.startswith("log of ") and f"pod {ns}/" in x.source for x in logs)
    found = b.lookup(old)
    assert found is not None and found.phase is Phase.SUCCEEDED
    assert b.cancel(old, 0).found
    # the caches are healthy: no cluster-wide list was needed to find the namespace
    assert not w.api.calls["list_job_for_all_namespaces"] + \
        w.api.calls["list_pod_for_all_namespaces"]


def test_a_forgotten_name_is_remembered_while_kubernetes_keeps_the_job() -> None:
    w = World(per_team=True)
    old = w.gang("old", 10, team="nlp")
    b = w.backend()
    b.observe([])
    w.now = NOW + timedelta(days=6)
    b.observe([])
    assert b._namespace_of(old) == "isthmus-nlp"
    w.now = NOW + timedelta(days=7, minutes=1)  # past ttl_after_finished_s: the Job is gone
    b.observe([])
    assert old not in b._forgotten


def test_cached_objects_carry_no_managed_fields_and_nodes_are_listed_once() -> None:
    w = World()
    for i in range(3):
        w.gang(f"run{i}", None)
    b = w.backend()
    assert all("managedFields" in o["metadata"] for o in w.api.pods)
    assert not any("managedFields" in o["metadata"] for o in b.reflectors["pods"].snapshot())
    listed = Counter[str]()
    nodes = b._nodes
    b._nodes = lambda: (listed.update(["nodes"]), nodes())[1]  # type: ignore[method-assign]
    facts = b.observe([])
    assert len(facts) == 3 and all(f.gpu_models for f in facts)
    assert listed["nodes"] == 1


def test_following_changes_starts_no_watch() -> None:
    """A replica that never leads the control loop never observes, so nothing would forget
    what its caches gather: following the change feed alone starts no watch."""
    b = K8sBackend("k8s", [POOL], K8sSettings())
    b.on_change(lambda: None)
    assert b.reflectors == {}


def test_kueue_workloads_of_forgotten_gangs_leave_their_cache_too() -> None:
    w = World()
    old, running = w.gang("old", 10), w.gang("running", None)
    b = w.backend(modes={"h100": "kueue"}, kueue_queues={"h100": "q"})
    b.reflectors["workloads"] = filled("workloads", [
        {"metadata": {"name": f"job-{j['metadata']['name']}", "namespace": "isthmus",
                      "ownerReferences": [{"kind": "Job", "uid": j["metadata"]["uid"]}]}}
        for j in w.api.jobs.values()])
    b.observe([])
    assert cached(b, "jobs") == {running}
    owners = [o["metadata"]["ownerReferences"][0]["uid"]
              for o in b.reflectors["workloads"].snapshot()]
    assert owners == [f"uid-0t{'running':0>14}"], (old, owners)


def test_without_a_ttl_a_forgotten_name_is_kept_for_ever() -> None:
    """Per-team namespaces, `ttl_after_finished_s: null`: the Job lives for ever, and so must
    the name that tells logs, lookup and cancel where it is (healthy caches answer alone)."""
    w = World(per_team=True)
    old = w.gang("old", 10, team="nlp")
    b = w.backend(ttl_after_finished_s=None)
    b.observe([])
    w.now = NOW + timedelta(days=30)
    b.observe([])
    assert b._namespace_of(old) == "isthmus-nlp"
    assert [x.rank for x in b.logs(old)] == [0, 1]


def test_a_forgotten_gang_still_asked_about_is_not_let_go() -> None:
    """Forgotten while nobody asked (an attempt not yet in the reconciler's list), then asked
    about pass after pass: its entry is kept from each ask, so it is read, never missing."""
    w = World()
    old = w.gang("old", 10)
    b = w.backend()
    b.observe([])
    for hours in (0.5, 1.0, 1.5, 2.0):
        w.now = NOW + timedelta(hours=hours)
        assert named(b.observe([old])) == {old: Phase.SUCCEEDED}, hours


def test_finished_pods_of_a_gang_without_a_job_leave_the_cache() -> None:
    """A pod-only re-list after the forgotten name expired brings a finished gang's pods back
    without its Job: they are dropped all the same; a running gang's pods are kept."""
    w = World()
    old, running = w.gang("old", 10), w.gang("running", None)
    b = w.backend()
    b.observe([])
    w.now = NOW + timedelta(hours=2)
    b.observe([])
    assert old not in b._forgotten
    b.reflectors["pods"].relist()
    assert cached(b, "pods") == {old, running}
    b.observe([])
    assert cached(b, "pods") == {running}
