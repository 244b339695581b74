"""Fixtures of the Kubernetes backend tests: an API client and a maker of backends in the
test's own namespace."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from backends.k8s import K8sBackend, create
from broker.config import Backend as BackendConfig
from broker.config import Pool
from tests.fixtures.k8s import K8sCluster
from tests.harness.k8s_backend import MakeBackend


@pytest.fixture
def api(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    with k8s_cluster.api_client() as api_client:
        yield api_client


@pytest.fixture
def make_backend(k8s_cluster: K8sCluster, k8s_namespace: str) -> Iterator[MakeBackend]:
    made: list[K8sBackend] = []

    def make(pools: tuple[str, ...] = ("h100", "a100"), **settings: Any) -> K8sBackend:
        cfg = BackendConfig(name="k8s-local", kind="k8s", settings={
            "kubeconfig": str(k8s_cluster.kubeconfig), "namespace": k8s_namespace,
            "create_namespace": False, "all_ranks_timeout_s": 30, **settings})
        pool_cfgs = [Pool(name=p, backend="k8s-local", flavor="h100-80g",
                          node_selector={"isthmus.io/pool": p}) for p in pools]
        backend = create(cfg, pool_cfgs)
        made.append(backend)
        return backend

    yield make
    for b in made:
        b.close()
