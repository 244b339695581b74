"""One constructor from a backend's result to a Fact: `Finding.fact`. A Finding has the
fields of a Fact but which object it is and when it was seen, with the same defaults, so that
the two cannot drift apart; `fact` carries every one of them."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from broker.domain.facts import Fact, Finding, Phase
from broker.domain.failures import FailureCategory
from broker.domain.reasons import Reason

IDENTITY = {"backend", "backend_name", "backend_id", "job_id", "attempt", "observed_at",
            "image_ids", "gpu_models"}
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def test_a_finding_has_the_fields_of_a_fact_but_its_identity() -> None:
    found = {f.name: f for f in dataclasses.fields(Finding) if f.name != "teardown"}
    assert set(found) == set(Fact.model_fields) - IDENTITY
    for name, f in found.items():
        want = Fact.model_fields[name]
        if f.default is not dataclasses.MISSING or want.is_required():
            assert f.default == (want.default if not want.is_required()
                                 else dataclasses.MISSING), name


def test_fact_carries_every_field_of_the_finding() -> None:
    finding = Finding(Phase.FAILED, Reason.InfraTransient, FailureCategory.INFRA_TRANSIENT,
                      "NODE_FAIL", "NodeDown", "a node failed", 1, 9, ("n1", "n2"),
                      NOW, NOW, NOW, ("n2",), "alice", teardown=True)
    fact = finding.fact(backend="b", backend_name="isthmus-x-1", observed_at=NOW,
                        backend_id="42", job_id="x", attempt=1, image_ids=("sha",),
                        gpu_models=("h100",))
    for f in dataclasses.fields(Finding):
        if f.name != "teardown":
            assert getattr(fact, f.name) == getattr(finding, f.name), f.name
    assert (fact.backend, fact.backend_name, fact.backend_id, fact.job_id, fact.attempt,
            fact.observed_at, fact.image_ids, fact.gpu_models) == (
        "b", "isthmus-x-1", "42", "x", 1, NOW, ("sha",), ("h100",))
