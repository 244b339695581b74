"""A preemption aborted at its commit as a deadlock victim is done again (admission._stop);
its metrics (the transition, the charged GPU-hours and waste) are counted once, after the
commit that kept it: counted before the commit, the aborted try counted them too."""

from typing import Any

import pytest
import sqlalchemy as sa

from broker.control import admission, reconcile_apply
from broker.orchestration import metrics_rule
from broker.store import quota_counters
from tests.builders import spec
from tests.harness.sim import Sim, cycle, run_until, submit


class _Deadlock(Exception):
    sqlstate = "40P01"


def test_a_preemption_done_again_after_a_deadlock_counts_once(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    lows = [submit(sim, spec().name(f"low-{t}").team(t).flavors("h100-80g").replicas(2)
                   .topology(None).set("priority", "low"), 3600) for t in ("vision", "language")]
    for j in lows:
        run_until(sim, j, "RUNNING", step=20)
    cycle(sim, 700)
    submit(sim, spec().name("urgent").flavors("h100-80g").replicas(2).topology(None)
           .set("priority", "high"), 60)
    charged: list[str] = []
    retrying: list[str] = []
    orig_charge, orig_count = reconcile_apply._count_charge, metrics_rule._count

    def count_charge(team: str, *a: Any) -> Any:
        charged.append(team)
        return orig_charge(team, *a)

    def count(src: Any, dst: Any, *a: Any) -> Any:
        if dst.value == "RETRYING":
            retrying.append(src.value)
        return orig_count(src, dst, *a)

    monkeypatch.setattr(reconcile_apply, "_count_charge", count_charge)
    monkeypatch.setattr(metrics_rule, "_count", count)
    orig_apply, hit = quota_counters.apply, {"n": 0}

    def deadlock_on_first_release(session: Any) -> None:
        if hit["n"] == 0 and any(g < 0 for g, _ in quota_counters.pending(session).values()):
            hit["n"] += 1
            raise sa.exc.OperationalError("UPDATE quota_usage ...", {}, _Deadlock("deadlock"))
        orig_apply(session)

    monkeypatch.setattr(quota_counters, "apply", deadlock_on_first_release)

    admission.run_admission(sim.plane)

    assert hit["n"] == 1  # the victim's first try was aborted at its commit
    assert charged and len(charged) == len(set(charged)), charged
    assert len(retrying) == len(charged), (retrying, charged)
