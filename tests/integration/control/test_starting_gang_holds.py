"""A gang seen starting keeps its whole placement held until every rank runs.

The Kubernetes backend's inventory counts the GPUs of pods bound to nodes; a Job whose pods
are not all created or bound yet shows only some of its nodes busy. Admission used to stop
holding an attempt's placement once the backend had shown the attempt at all, so the next
cycle saw the other nodes free and placed a second gang on them (a double booking found by
bench/gang_bench.py on the real control plane). Here the simulated backend's inventory is
made to show a starting gang's first node only, as Kubernetes does with one pod bound."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from backends.sim.backend import SimBackend
from broker.domain.facts import Fact, Phase
from broker.domain.inventory import InventorySnapshot
from tests.builders import spec
from tests.harness.sim import Sim, attempts_of, cycle, state, submit


class OnePodBound:
    """`inner` whose inventory shows only the first node of each starting gang busy."""

    def __init__(self, inner: SimBackend) -> None:
        self.inner = inner
        self.starting: set[str] = set()

    def observe(self, names: Sequence[str] | None = None) -> Sequence[Fact]:
        facts = self.inner.observe(names)
        self.starting = {f.backend_name for f in facts if f.phase is Phase.STARTING}
        return facts

    def inventory(self) -> InventorySnapshot:
        snap = self.inner.inventory()
        unbound: dict[str, int] = {}
        for job in self.inner.jobs.values():
            if job.name in self.starting:
                for node in job.nodes[1:]:
                    unbound[node] = unbound.get(node, 0) + job.gpus
        pools = tuple(p.model_copy(update={"nodes": tuple(
            n.model_copy(update={"free_gpus": n.free_gpus + unbound.get(n.name, 0)})
            for n in p.nodes)}) for p in snap.pools)
        return snap.model_copy(update={"pools": pools})

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


def test_a_second_gang_waits_while_the_first_one_starts(sim: Sim) -> None:
    k8s = sim.backends["sim-k8s"]
    wrapped = OnePodBound(k8s)
    cast(dict[str, Any], sim.plane.backends)["sim-k8s"] = wrapped
    # k8s-a100: 8 nodes of 8 GPUs; the first gang takes all of them
    first = submit(sim, spec().name("first").team("vision").flavors("a100-80g").replicas(8)
                   .gpus(8).topology(None), 600)
    cycle(sim, 5)  # admitted, dispatched, seen starting (ranks start after 30 s)
    assert wrapped.starting, "the first gang should be seen starting"
    assert attempts_of(sim, first)[-1].last_seen_at is not None
    free = sum(n.free_gpus for p in wrapped.inventory().pools for n in p.nodes)
    assert free == 56, free  # what the backend shows: one node busy
    second = submit(sim, spec().name("second").team("vision").flavors("a100-80g").replicas(1)
                    .gpus(8).topology(None), 600)
    cycle(sim, 5)
    assert state(sim, second)[0] == "QUEUED", state(sim, second)
    assert state(sim, first)[0] in ("PREPARING", "RUNNING", "ADMITTED"), state(sim, first)
