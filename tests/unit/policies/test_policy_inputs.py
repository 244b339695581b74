"""broker.policy_inputs: config and specs become the policies' neutral views."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from broker.config import IsthmusConfig
from broker.domain import Attempt, FailureCategory, RunSnapshot
from broker.domain.attempts import Placement
from broker.domain.spec import BackendKind
from broker.domain.topology import TopologyLevel
from broker.policy_inputs import attempt_counts, pending_job, quota_config, running_job
from tests.builders import spec

T = datetime(2025, 1, 1, tzinfo=UTC)


def test_quota_config_mirrors_teams_and_costs(example_config: IsthmusConfig) -> None:
    qc = quota_config(example_config)
    assert qc.quota("vision", "h100-80g").nominal == 64
    assert qc.quota("vision", "h100-80g").lendable == 32
    assert qc.quota("language", "a100-80g").guaranteed == 16
    assert qc.cohort_of("vision") == "research"
    assert qc.cost("h100-80g") == 2.0


def test_pending_job_view(example_config: IsthmusConfig) -> None:
    s = spec().set("priority", "high").replicas(4).gpus(8).build()
    j = pending_job(example_config, "j1", s, T, exclude_pools=["slurm-h100"])
    assert (j.priority, j.can_preempt, j.total_gpus) == (1000, True, 32)
    assert j.flavors == ("h100-80g", "a100-80g")
    assert j.topology_required is TopologyLevel.RACK
    assert j.exclude_pools == frozenset({"slurm-h100"})


def test_running_job_expected_end_from_max_runtime(example_config: IsthmusConfig) -> None:
    r = running_job(example_config, "j1", spec().build(), flavor="h100-80g", pool="p", started_at=T)
    assert r.expected_end == T + timedelta(hours=2) and r.gpus == 16 and r.priority == 100


def test_attempt_counts() -> None:
    snap = RunSnapshot.of(spec().build()).model_copy(
        update={
            "placement": Placement(
                backend=BackendKind.SLURM, backend_instance="s", pool="p1", flavor="h100-80g"
            )
        }
    )

    def att(n: int, failure: FailureCategory | None, preempted: bool = False) -> Attempt:
        return Attempt(
            job_id="j", number=n, snapshot=snap, created_at=T, failure=failure, preempted=preempted
        )

    c = attempt_counts(
        [
            att(1, FailureCategory.INFRA_TRANSIENT),
            att(2, None, preempted=True),
            att(3, FailureCategory.INFRA_TRANSIENT),
        ]
    )
    assert (c.failures, c.preemptions, c.failures_in_pool) == (2, 1, 2)
    assert c.by_category == {FailureCategory.INFRA_TRANSIENT: 2}


def test_the_image_placement_needs_is_the_ranks_image(example_config: IsthmusConfig) -> None:
    """A command's image binds every rank; the image isbatch gives an sbatch script (launcher
    'batch') is what it runs in on Kubernetes, and binds nothing on Slurm."""
    ranks = spec().set("entrypoint", {"image": "r/train:1", "command": ["python"]}).build()
    batch = spec().set("entrypoint", {"image": "r/hpc:1", "script": "#!/bin/bash\nsrun x\n",
                                      "launcher": "batch"}).build()
    assert pending_job(example_config, "j1", ranks, T).image == "r/train:1"
    assert pending_job(example_config, "j2", batch, T).image is None
