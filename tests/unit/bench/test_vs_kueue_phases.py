"""The per-phase breakdown of bench/vs_kueue.py: each step of a gang is its last pod's time,
a gang counts for a step only once all its pods reached it, and the totals are what the
benchmark's notes say (held = admitted -> released; the wait from a release to the next
admission)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.vs_kueue_phases import (
    Phases,
    add_jobs,
    add_pods,
    add_workloads,
    capacity_bound,
    rows,
    table,
    ts,
)


def _t(s: int) -> str:
    return f"2026-12-01T10:00:{s:02d}Z"


def _pod(gang: int, created: int, scheduled: int | None, started: int | None,
         finished: int | None) -> dict[str, Any]:
    conds = [] if scheduled is None else [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": _t(scheduled)}]
    state: dict[str, Any] = {}
    if finished is not None and started is not None:
        state = {"terminated": {"startedAt": _t(started), "finishedAt": _t(finished)}}
    elif started is not None:
        state = {"running": {"startedAt": _t(started)}}
    return {"metadata": {"labels": {"g": str(gang)}, "creationTimestamp": _t(created)},
            "status": {"conditions": conds, "containerStatuses": [{"state": state}]}}


def gang_of(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["labels"]["g"])


def test_a_gang_step_is_its_last_pod_and_needs_every_pod() -> None:
    phases = Phases()
    pods = [_pod(0, 1, 2, 4, 7), _pod(0, 2, 3, 5, 8),  # both ranks of gang 0 done
            _pod(1, 1, 2, 4, None), _pod(1, 1, None, None, None)]  # gang 1: one unbound
    add_pods(phases, pods, gang_of, {0: 2, 1: 2})
    zero = phases.at[0]
    assert [zero[k] - zero["pods"] for k in ("scheduled", "running", "done")] == [1, 3, 6]
    assert set(phases.at[1]) == {"pods"}  # not scheduled, running or done: a rank is missing


def test_rows_give_each_phase_and_the_held_time() -> None:
    phases = Phases()
    t0 = ts(_t(0))
    assert t0 is not None
    for g, base in ((0, t0), (1, t0 + 10)):
        phases.put(g, "submitted", base)
        phases.put(g, "admitted", base + 1)
    add_jobs(phases, [{"metadata": {"name": "j0", "creationTimestamp": _t(3)},
                       "status": {"completionTime": _t(12)}}],
             lambda j: 0, started_is_creation=True)
    add_workloads(phases, [{"metadata": {"ownerReferences": [{"kind": "Job", "name": "j1"}]},
                            "status": {"conditions": [
                                {"type": "Admitted", "status": "True",
                                 "lastTransitionTime": _t(11)},
                                {"type": "Finished", "status": "True",
                                 "lastTransitionTime": _t(20)}]}}],
                  lambda name: 1 if name == "j1" else None)
    phases.put(0, "released", phases.at[0]["complete"] + 0.5)
    measured = {label: (n, p50) for label, n, p50, _ in rows(phases)}
    assert measured["submit -> admitted"] == (2, 1.0)  # gang 2 has no submit
    assert measured["admitted -> job started"] == (1, 2.0)  # gang 0 only
    held = sorted(s["released"] - s["admitted"] for s in phases.at.values())
    assert held == [9.0, 11.5] and measured["held (admitted -> released)"] == (2, 10.25)
    # gang 0 released at 12.5 s; the next admission after it is gang 2's at 13 s. Gang 1's
    # release (20 s) has no later admission: nobody was waiting, so it does not count
    phases.put(2, "admitted", t0 + 13)
    assert [r[1:3] for r in rows(phases) if r[0] == "release -> next admission"] == [(1, 0.5)]
    assert table({"a": phases})[2].startswith("| submit -> admitted | 1.0 / 1.0 s (2)")


def test_capacity_bound_is_the_gangs_over_the_perfectly_packed_makespan() -> None:
    # 760 GPUs x 3 s on 128 GPUs: 17.8 s at the very least for 50 gangs
    assert capacity_bound(760 * 3, 128, 50) == pytest.approx(2.807, abs=1e-3)
