"""Backend settings (isthmus.yaml ``backends[].settings`` for kind ``k8s``) and pool bindings.

Checked up front: an unknown key or a bad mode is an error at start-up naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict

from backends.base import SettingsError, parse_settings

MODES = ("plain", "kueue", "volcano")
TEAM_FIELD = "{team}"
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_PREFIX = "isthmus.io/"
MANAGED_BY = "isthmus"


@dataclass(frozen=True, slots=True)
class K8sSettings:
    __pydantic_config__ = ConfigDict(extra="forbid")  # parse_settings: unknown keys refused

    # connection
    kubeconfig: str | None = None  # None: in-cluster config, else $KUBECONFIG / ~/.kube/config
    context: str | None = None
    request_timeout_s: float = 15.0
    # where Isthmus objects live; "isthmus-{team}" gives each team a namespace of its own
    # (created on first use, labelled with the team)
    namespace: str = "isthmus"
    create_namespace: bool = True
    # node labels
    rack_label: str = "topology.isthmus.io/rack"
    block_label: str = "topology.isthmus.io/block"
    hostname_label: str = "kubernetes.io/hostname"  # pins ranks to the chosen nodes
    gpu_resource: str = "nvidia.com/gpu"
    gpu_product_label: str = "nvidia.com/gpu.product"
    gpu_memory_label: str = "nvidia.com/gpu.memory"  # MiB
    # gangs
    all_ranks_timeout_s: float = 300.0  # first rank scheduled -> every rank Running
    image_pull_timeout_s: float = 600.0  # ErrImagePull / ImagePullBackOff tolerated this long
    node_lost_toleration_s: int = 60  # NoExecute not-ready/unreachable tolerationSeconds
    master_port: int = 29500
    container_name: str = "trainer"
    ttl_after_finished_s: int | None = 7 * 86400  # finished Jobs are garbage-collected after
    # a finished gang the broker no longer asks about leaves the watch caches this long after
    # it finished (backends/k8s/forget.py)
    forget_finished_after_s: float = 300.0
    pod_labels: Mapping[str, str] = field(default_factory=dict)  # added to every pod
    pod_annotations: Mapping[str, str] = field(default_factory=dict)  # e.g. sidecar opt-outs
    # per pool: "plain" (default), "kueue" or "volcano"
    modes: Mapping[str, str] = field(default_factory=dict)
    kueue_queues: Mapping[str, str] = field(default_factory=dict)  # pool -> LocalQueue
    kueue_api_version: str = "v1beta2"  # of kueue.x-k8s.io Workloads (read in kueue mode)
    volcano_queues: Mapping[str, str] = field(default_factory=dict)  # pool -> Volcano queue
    # per pool tolerations (list of Kubernetes toleration dicts); when a pool has none here,
    # the taints common to its nodes are tolerated (learned from the inventory)
    tolerations: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    # classification
    oom_is_user_error: bool = True
    # watch
    watch_timeout_s: int = 300  # server-side timeout of one watch request
    max_backoff_s: float = 10.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> K8sSettings:
        """Raises SettingsError (a ValueError) naming every bad key."""
        values = dict(data or {}) if isinstance(data, Mapping) else data
        if isinstance(values, dict):
            for key in ("modes", "kueue_queues", "volcano_queues", "pod_labels",
                        "pod_annotations"):
                # YAML reads `tier: 1` as a number; labels and annotations are text
                v = values.get(key)
                if isinstance(v, Mapping):
                    values[key] = {str(k): str(x) if isinstance(x, int | float | bool) else x
                                   for k, x in v.items()}
        settings = parse_settings(cls, values, "k8s")
        problems: list[tuple[str, str]] = []
        for pool, mode in settings.modes.items():
            if mode not in MODES:
                problems.append((f"modes.{pool}", f"'{mode}' — each pool's mode must be one of "
                                 f"{list(MODES)}"))
            elif mode == "kueue" and pool not in settings.kueue_queues:
                problems.append(("kueue_queues", f"pool {pool} uses mode 'kueue' and needs a "
                                 "LocalQueue name (kueue_queues: {pool: queue})"))
        if not _NAMESPACE.match(settings.namespace.replace(TEAM_FIELD, "t")):
            problems.append(("namespace", f"'{settings.namespace}' must be a DNS label, "
                             f"optionally with {TEAM_FIELD} for the team (isthmus-{TEAM_FIELD})"))
        for key, ok, rule in (
                ("all_ranks_timeout_s", settings.all_ranks_timeout_s > 0, "> 0"),
                ("request_timeout_s", settings.request_timeout_s > 0, "> 0"),
                ("forget_finished_after_s", settings.forget_finished_after_s >= 0, ">= 0")):
            if not ok:
                problems.append((key, f"must be {rule} seconds"))
        if not 1 <= settings.master_port <= 65535:
            problems.append(("master_port", "must be a TCP port (1-65535)"))
        if problems:
            raise SettingsError(problems)
        return settings

    def mode(self, pool: str) -> str:
        return self.modes.get(pool, "plain")

    @property
    def per_team(self) -> bool:
        """Each team's objects in a namespace of its own (`namespace` holds {team})."""
        return TEAM_FIELD in self.namespace

    def namespace_for(self, team: str) -> str:
        return self.namespace.replace(TEAM_FIELD, team)


@dataclass(frozen=True, slots=True)
class K8sPoolBinding:
    """An isthmus.yaml pool served by this backend: its node selector and flavor."""

    name: str
    flavor: str
    node_selector: Mapping[str, str]
    cost_weight: float = 1.0
    shared: bool = True
    drained: bool = False
    tolerations: tuple[Mapping[str, Any], ...] = ()

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.node_selector.items())

    @property
    def selector_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.node_selector.items()))


def pool_tolerations(pool: K8sPoolBinding, settings: K8sSettings) -> tuple[Mapping[str, Any], ...]:
    """What a pool's pods tolerate: configured tolerations, else the taints named by its own
    node selector (``isthmus.io/pool=h100:NoSchedule`` for selector ``isthmus.io/pool: h100``)."""
    configured = settings.tolerations.get(pool.name)
    if configured is not None:
        return tuple(configured)
    if pool.tolerations:
        return pool.tolerations
    return tuple({"key": k, "operator": "Equal", "value": v}
                 for k, v in sorted(pool.node_selector.items()))
