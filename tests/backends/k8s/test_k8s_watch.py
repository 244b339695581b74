"""The Kubernetes backend's watches against the real local control plane: a 410 Gone makes
them re-list, and an API server that goes away (here: the TCP path to it, through a proxy we
stop and start, so that other tests sharing the cluster are not disturbed) is
BackendUnavailable while it lasts, then the watches reconnect and catch up."""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
from kubernetes import client

from backends.base import BackendUnavailable
from backends.k8s import K8sBackend
from backends.k8s.watch import Gone, Reflector
from broker.config import Backend as BackendConfig
from broker.config import Pool
from broker.domain.facts import Phase
from broker.wiring.adapters import k8s_adapter
from tests.fixtures.k8s import FAKE_DURATION, K8sCluster, as_dict
from tests.harness.k8s_requests import request
from tests.harness.kube_objects import new_job_id
from tests.harness.wait import wait_until

pytestmark = pytest.mark.k8s


class TcpProxy:
    """127.0.0.1:<port> -> the API server; stop() drops the listener and every connection."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(64)
        self.port = ls.getsockname()[1]
        self._listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                down, _ = ls.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.target)
            except OSError:
                down.close()
                continue
            with self._lock:
                self._conns += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


@pytest.fixture
def proxy(k8s_cluster: K8sCluster) -> Iterator[TcpProxy]:
    url = urlparse(k8s_cluster.api_url)
    p = TcpProxy((url.hostname or "127.0.0.1", url.port or 443))
    p.start()
    yield p
    p.stop()


def _backend(k8s_cluster: K8sCluster, namespace: str, api_client: Any, **settings: Any
             ) -> K8sBackend:
    cfg = BackendConfig(name="k8s-local", kind="k8s", settings={
        "namespace": namespace, "create_namespace": False, "max_backoff_s": 0.5,
        "request_timeout_s": 5, **settings})
    pools = [Pool(name="a100", backend="k8s-local", flavor="a100-80g",
                  node_selector={"isthmus.io/pool": "a100"})]
    return k8s_adapter(cfg, pools, api_client=api_client)


def _event(name: str, namespace: str) -> client.CoreV1Event:
    return client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=name),
        involved_object=client.V1ObjectReference(kind="ConfigMap", name="probe",
                                                namespace=namespace),
        reason="IsthmusTest", message="watch probe", type="Normal")


def test_watch_from_a_compacted_version_gets_410_and_relists(
    k8s_cluster: K8sCluster, k8s_namespace: str
) -> None:
    # A 410 comes from etcd compaction. The API server serves events straight from etcd
    # (their watch cache is off by default), so compacting etcd to its current revision makes
    # every older version gone, on a fresh cluster as well as on one that has run for hours.
    with k8s_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_event(k8s_namespace, _event("before", k8s_namespace))
        compacted_at = k8s_cluster.compact_etcd()
        assert compacted_at > 1
        lister = functools.partial(core.list_namespaced_event, k8s_namespace)
        probe = Reflector("events", lister, resume_from="1")
        with pytest.raises(Gone):
            probe._watch_once()  # the API server answers 410 for a compacted version

        reflector = Reflector("events", lister, resume_from="1", max_backoff_s=0.5)
        reflector.start()
        try:
            assert reflector.wait_for(lambda r: r.synced, timeout=30), reflector.last_error
            assert reflector.relists == 1  # listed because of the 410, not before
            assert reflector.get(f"{k8s_namespace}/before") is not None
            core.create_namespaced_event(k8s_namespace, _event("seen", k8s_namespace))
            key = f"{k8s_namespace}/seen"
            assert reflector.wait_for(lambda r: r.get(key) is not None, timeout=30)
            assert reflector.healthy
        finally:
            reflector.stop()


def test_backend_unavailable_while_the_api_server_is_gone_then_the_watch_catches_up(
    k8s_cluster: K8sCluster, k8s_namespace: str, proxy: TcpProxy
) -> None:
    api = k8s_cluster.api_client()
    api.configuration.host = f"https://127.0.0.1:{proxy.port}"
    backend = _backend(k8s_cluster, k8s_namespace, api,
                       pod_annotations={FAKE_DURATION: "4s"})
    try:
        req = request(pool="a100", replicas=1, gpus=1, job_id=new_job_id())
        backend.submit(req)
        backend.start()
        refl = backend.reflectors
        assert all(r.wait_for(lambda r: r.healthy, timeout=30) for r in refl.values())
        wait_until(lambda: any(f.backend_name == req.name and f.phase is Phase.RUNNING
                               for f in backend.observe()), timeout=30, what="RUNNING")

        proxy.stop()  # the API server is unreachable
        assert all(r.wait_for(lambda r: not r.connected, timeout=30) for r in refl.values())
        with pytest.raises(BackendUnavailable):
            backend.observe()
        with pytest.raises(BackendUnavailable):
            backend.inventory()
        with pytest.raises(BackendUnavailable):
            backend.submit(request(pool="a100", replicas=1, gpus=1, job_id=new_job_id()))
        with pytest.raises(BackendUnavailable):
            backend.cancel(req.name, 0)
        reconnects = {k: r.reconnects for k, r in refl.items()}

        # meanwhile the job finishes; once the API server is back the watch catches up
        with k8s_cluster.api_client() as direct:
            batch = client.BatchV1Api(direct)
            wait_until(lambda: as_dict(batch.read_namespaced_job_status(
                req.name, k8s_namespace))["status"].get("succeeded") == 1,
                timeout=60, what="the job to finish")
        proxy.start()
        assert all(r.wait_for(lambda r: r.healthy, timeout=30) for r in refl.values())
        assert all(reconnects[k] >= 1 for k in refl)
        # each watch relists on its own after the reconnect: the job's end is seen once the
        # job and pod caches have both caught up (polled: a busy machine relists later)
        wait_until(lambda: any(f.backend_name == req.name and f.phase is Phase.SUCCEEDED
                               for f in backend.observe()), timeout=30, what="SUCCEEDED")
        assert refl["jobs"].healthy  # ... and that came from the watch cache
    finally:
        backend.close()


def test_on_change_calls_back_when_a_gang_changes_not_when_nothing_does(
    k8s_cluster: K8sCluster, k8s_namespace: str
) -> None:
    """The hook a control loop can wake on: called from the watches as a gang's Job and pods
    change (here: until it has ended), without anyone polling `observe`."""
    backend = _backend(k8s_cluster, k8s_namespace, k8s_cluster.api_client(),
                       pod_annotations={FAKE_DURATION: "1s"})
    calls: list[float] = []
    try:
        backend.on_change(lambda: calls.append(time.monotonic()))
        assert backend.reflectors == {}  # a replica that never leads keeps no caches
        backend.start()  # as the first observe does
        assert all(r.wait_for(lambda r: r.healthy, timeout=30)
                   for r in backend.reflectors.values())
        assert calls == []  # the first list is no change
        req = request(pool="a100", replicas=1, gpus=1, job_id=new_job_id())
        backend.submit(req)

        def ended() -> bool:
            pods = [p for p in backend.reflectors["pods"].snapshot()
                    if p["metadata"]["labels"].get("isthmus.io/name") == req.name]
            return bool(pods) and pods[0]["status"].get("phase") == "Succeeded"

        wait_until(ended, timeout=60, interval=0.2, what="the gang's pod to succeed")
        # the Job and its pod were added and modified up to the end: several calls
        assert len(calls) >= 3
        # a listener that fails does not stop the watch
        def broken() -> None:
            raise RuntimeError("a listener's bug")

        backend.on_change(broken)
        assert backend.cancel(req.name, 0).found
        assert backend.reflectors["jobs"].wait_for(
            lambda r: not any(j["metadata"]["name"] == req.name for j in r.snapshot()),
            timeout=60)
        assert backend.reflectors["jobs"].healthy
    finally:
        backend.close()
