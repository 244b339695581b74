"""The control plane's caches are declared (broker.control.soft_state), each bounded: nothing
is hung on the plane by the passes, and the specs cache drops the least recently used."""

from __future__ import annotations

from dataclasses import fields

import pytest

from broker.control import soft_state
from broker.control.plane import ControlPlane
from broker.control.soft_state import SoftState
from tests.builders import spec
from tests.harness.sim import Sim, cycle, run_until, submit


def test_the_passes_keep_their_state_only_in_declared_fields(sim: Sim) -> None:
    jobs = [submit(sim, spec().name(f"j{i}").flavors("a100-80g").replicas(1).topology(None),
                   60) for i in range(3)]
    for j in jobs:
        run_until(sim, j, "SUCCEEDED", step=20)
    cycle(sim, 30)
    declared = {f.name for f in fields(ControlPlane)} | {"_inventories", "_gates"}
    assert set(vars(sim.plane)) <= declared, set(vars(sim.plane)) - declared
    assert set(vars(sim.plane.soft)) == {f.name for f in fields(SoftState)}
    assert sim.plane.soft.views is not None  # the admission pass did use its cache


def test_the_specs_cache_keeps_the_most_recently_used(sim: Sim,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soft_state, "SPECS_MAX", 3)
    plane = sim.plane
    plane.soft = SoftState()
    text = spec().name("x").flavors("a100-80g").build().model_dump_json()
    for i in range(10):
        plane.spec(f"job-{i}", text)
    assert len(plane.soft.specs) == 3
    assert set(plane.soft.specs) == {"job-7", "job-8", "job-9"}
