"""Explain: stable, ordered verdicts and the most severe reason, as text and as data."""

from __future__ import annotations

from broker.domain import Reason
from policies.cycle import admission_cycle
from policies.explain import Explanation, explain, explain_job
from policies.types import Usage
from tests.unit.policies.builders import at, inventory, make_job, make_pool, q, quota_config

QUOTAS = quota_config({"vision": (None, {"h100": q(64), "a100": q(8)})})
INV = inventory(
    make_pool("z-busy").use_all_but({}),
    make_pool("a-down").on("slurm-b"),
    make_pool("m-a100").flavor_("a100"),
    make_pool("drained").set(drained=True),
    unreachable=("slurm-b",),
)


def test_waiting_job_lists_every_pool_most_severe_first() -> None:
    job = make_job().gpus(8).replicas(2).flavors("h100", "a100").build()
    e = explain_job(job, INV, QUOTAS, Usage(), at(0))
    assert not e.admitted
    assert [p.pool for p in e.pools] == ["a-down", "drained", "m-a100", "z-busy"]
    assert [p.reason for p in e.pools] == [
        Reason.BackendUnavailable,
        Reason.PoolDrained,
        Reason.QuotaExhausted,
        Reason.InsufficientCapacity,
    ]
    assert e.reason is Reason.BackendUnavailable and e.most_severe is Reason.BackendUnavailable
    text = e.to_text()
    assert "waiting - BackendUnavailable" in text
    assert "uses 0 of 8 nominal a100 GPUs and needs 16 more" in text


def test_admitted_job_shows_the_placement_first() -> None:
    job = make_job().gpus(8).flavors("a100", "h100").build()
    e = explain_job(job, INV, QUOTAS, Usage(), at(0))
    assert e.admitted and e.placement is not None and e.placement.pool == "m-a100"
    assert e.pools[0].pool == "m-a100" and e.pools[0].fits
    assert "placement: m-a100 on slurm/slurm-a, flavor a100 node" in e.to_text()


def test_round_trips_as_data_and_is_stable() -> None:
    job = make_job().id("fixed").gpus(8).replicas(2).build()
    one = explain_job(job, INV, QUOTAS, Usage(), at(0))
    two = explain(admission_cycle([job], INV, QUOTAS, Usage(), at(0)).decisions[0])
    assert one == two and one.to_text() == two.to_text()
    assert Explanation.model_validate(one.model_dump(mode="json")) == one


def test_a_pool_line_is_its_verdict_plus_severity() -> None:
    """The stored/wire line and the cycle's verdict are one concept in two forms: every field
    of the line but `severity` is the verdict's, under the same name and value."""
    import dataclasses

    from policies.explain import PoolLine
    from policies.placement import PoolVerdict

    verdict_fields = {f.name for f in dataclasses.fields(PoolVerdict)}
    assert set(PoolLine.model_fields) - {"severity"} <= verdict_fields
    assert verdict_fields - set(PoolLine.model_fields) == {"expected_wait_s"}
    job = make_job().gpus(8).replicas(8).build()
    d = admission_cycle([job], inventory(make_pool("p1").shape(1, 1, 2)), QUOTAS, Usage(),
                        at(0)).decisions[0]
    line = explain(d).pools[0]
    v = d.verdicts[0]
    assert {f: getattr(line, f) for f in PoolLine.model_fields if f != "severity"} == \
        {f: getattr(v, f) for f in PoolLine.model_fields if f != "severity"}
