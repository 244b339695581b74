"""Kubernetes observe at scale (issue 6 benchmark; not a timed test).

1,000 Isthmus gangs of 4 ranks (4,000 pods) in a dedicated namespace of the local control plane
(deploy/testenv/k8s must be up). The Jobs carry ``spec.managedBy`` so that the Job controller
leaves them alone and the benchmark creates the pods itself, fast; the pods name a scheduler
that does not exist, so they stay Pending and take nothing from the shared fake nodes, except
for a quarter of the gangs whose pods get a Running status written through the status
subresource. Then, several times: re-list Jobs and Pods into the watch caches (timed), and
build the full fact set from the caches (timed). The namespace is deleted at the end.

Prints `k8s_observe: <N> jobs <P> pods relist <T> ms facts <F> ms` last (medians).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from backends.k8s import K8sBackend, K8sPoolBinding, K8sSettings
from backends.k8s.manifests import COMPLETION_INDEX
from tests.harness.k8s_requests import request

MANAGED_BY = "isthmus.io/bench"


def _pods(job: dict[str, Any], uid: str, replicas: int, running: bool) -> list[dict[str, Any]]:
    name = job["metadata"]["name"]
    tmpl = job["spec"]["template"]
    pods = []
    for i in range(replicas):
        spec = copy.deepcopy(tmpl["spec"])
        spec["schedulerName"] = "isthmus-bench-none"  # nobody binds them
        spec["hostname"] = f"{name}-{i}"
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": f"{name}-{i}-bench",
                "labels": {**tmpl["metadata"]["labels"], "batch.kubernetes.io/job-name": name},
                "annotations": {COMPLETION_INDEX: str(i)},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                     "uid": uid, "controller": True}],
            },
            "spec": spec,
            "_running": running,
        })
    return pods


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kubeconfig", default="/tmp/isthmus-k8s/kubeconfig")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    if not Path(args.kubeconfig).exists():
        sys.exit(f"{args.kubeconfig} not found: run deploy/testenv/k8s/up first")

    ns = f"isthmus-bench-{uuid.uuid4().hex[:6]}"
    pool = K8sPoolBinding(name="a100", flavor="a100-80g", node_selector={"isthmus.io/pool": "a100"})
    settings = K8sSettings(kubeconfig=args.kubeconfig, namespace=ns, request_timeout_s=60)
    backend = K8sBackend("k8s-bench", [pool], settings)
    core, batch = backend.apis.core, backend.apis.batch
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        t0 = time.perf_counter()
        jobs = []
        for j in range(args.jobs):
            req = request(pool="a100", replicas=args.replicas, gpus=8,
                          job_id=f"0b{j:014d}")
            job = backend.render(req)[0]
            job["spec"]["managedBy"] = MANAGED_BY
            jobs.append(job)

        def make_job(job: dict[str, Any]) -> tuple[dict[str, Any], str]:
            made = batch.create_namespaced_job(ns, job)
            return job, made.metadata.uid

        with ThreadPoolExecutor(args.threads) as pool_ex:
            created = list(pool_ex.map(make_job, jobs))
        pods = [p for i, (job, uid) in enumerate(created)
                for p in _pods(job, uid, args.replicas, running=i % 4 == 0)]

        def make_pod(pod: dict[str, Any]) -> None:
            running = pod.pop("_running")
            core.create_namespaced_pod(ns, pod, _preload_content=False)
            if running:
                now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                status = {"status": {
                    "phase": "Running", "startTime": now,
                    "conditions": [{"type": "PodScheduled", "status": "True",
                                    "lastTransitionTime": now}],
                    "containerStatuses": [{
                        "name": "trainer", "image": "trainer:1", "imageID": "", "ready": True,
                        "restartCount": 0, "state": {"running": {"startedAt": now}}}],
                }}
                core.patch_namespaced_pod_status(
                    pod["metadata"]["name"], ns, status, _preload_content=False,
                    _content_type="application/merge-patch+json")

        with ThreadPoolExecutor(args.threads) as pool_ex:
            list(pool_ex.map(make_pod, pods))
        setup_s = time.perf_counter() - t0
        print(f"created {len(created)} jobs and {len(pods)} pods in {setup_s:.1f}s",
              file=sys.stderr)

        backend.start()
        refl = backend.reflectors
        for r in refl.values():
            r.wait_for(lambda r: r.healthy, timeout=120)
        relist_ms, facts_ms = [], []
        nfacts = 0
        phases: dict[str, int] = {}
        for _ in range(args.passes):
            t = time.perf_counter()
            refl["jobs"].relist()
            refl["pods"].relist()
            relist_ms.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            facts = backend.observe()
            facts_ms.append((time.perf_counter() - t) * 1000)
            nfacts = len(facts)
            phases = {}
            for f in facts:
                phases[f.phase.value] = phases.get(f.phase.value, 0) + 1
        npods = len(refl["pods"].snapshot())
        print(f"facts {nfacts} by phase {phases}; relist ms {[round(x) for x in relist_ms]}; "
              f"facts ms {[round(x) for x in facts_ms]}", file=sys.stderr)
        print(f"k8s_observe: {nfacts} jobs {npods} pods relist "
              f"{statistics.median(relist_ms):.0f} ms facts {statistics.median(facts_ms):.0f} ms")
    finally:
        backend.close()
        from kubernetes import client

        with K8sBackend("k8s-bench", [pool], settings).apis.api_client as api:
            client.CoreV1Api(api).delete_namespace(ns, propagation_policy="Background")


if __name__ == "__main__":
    main()
