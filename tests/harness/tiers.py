"""The test tiers. The full suite (``scripts/test``, no ``-m``) runs every test. Tests marked
``slow`` or ``ui`` run there and under any ``-m`` that names their marker; an ``-m`` that names
neither, such as the fast tier ``-m "not slurm and not k8s and not postgres"``, leaves them out
(pytest reports them as deselected). tests/conftest.py applies this at collection.

``scripts/test`` runs the suite on two pytest-xdist workers (``--dist loadgroup``). The tests of
the local Slurm cluster and Kubernetes control planes share one group, so they run one after
the other in one worker, as they did in one process: the clusters are shared state (the Slurm
fixture cancels every job left in the queue when it starts, an outage test stops slurmctld, a
node test kills a slurmd), while every other test owns what it starts (its server on a free
port, its database, its temporary directory) and runs beside them in the other worker."""

from __future__ import annotations

import re

import pytest

OUT_OF_FAST_TIER = ("slow", "ui")


def left_out_by(markexpr: str) -> set[str]:
    """The markers of `OUT_OF_FAST_TIER` whose tests an ``-m`` expression leaves out because it
    does not name them; none without an expression."""
    if not markexpr.strip():
        return set()
    named = set(re.findall(r"[A-Za-z_][\w-]*", markexpr))
    return {m for m in OUT_OF_FAST_TIER if m not in named}


CLUSTER_GROUP = "local-clusters"
CLUSTER_MARKERS = frozenset({"slurm", "k8s"})
CLUSTER_FIXTURES = frozenset({"slurm_cluster", "k8s_cluster", "k8s_kueue_cluster"})


def on_local_cluster(item: pytest.Item) -> bool:
    """Whether a test uses a local cluster: marked for one, or asking (directly or through
    another fixture) for one of the cluster fixtures."""
    if any(m.name in CLUSTER_MARKERS for m in item.iter_markers()):
        return True
    return bool(CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())))
