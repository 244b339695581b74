"""`logs` of the Kubernetes backend on the local control plane: one entry per rank's pod. The
nodes are kwok's fake nodes, which have no kubelet to serve a log: each rank then says so."""

from __future__ import annotations

import pytest

from broker.domain.facts import Phase
from tests.fixtures.k8s import FAKE_DURATION
from tests.harness.k8s_backend import MakeBackend, wait_fact
from tests.harness.k8s_requests import request
from tests.harness.kube_objects import new_job_id

pytestmark = pytest.mark.k8s


def test_logs_have_one_entry_per_rank_pod(make_backend: MakeBackend) -> None:
    backend = make_backend(pod_annotations={FAKE_DURATION: "60s"})
    req = request(pool="a100", replicas=2, gpus=1, job_id=new_job_id())
    assert backend.logs(req.name) == []  # nothing submitted: no pods
    backend.submit(req)
    wait_fact(backend, req.name, lambda f: f.phase is Phase.RUNNING)
    logs = backend.logs(req.name, tail=10)
    assert [x.rank for x in logs] == [0, 1], logs
    for x in logs:
        assert x.source.startswith("pod ") and req.name in x.source
        # a real kubelet serves text; a kwok node serves nothing, and the note says why
        assert x.text or x.note.startswith("no log from node"), x
    (one,) = backend.logs(req.name, rank=1)
    assert one.rank == 1
    backend.cancel(req.name, 0)
