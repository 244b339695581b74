from __future__ import annotations

import pytest

from broker.config import IsthmusConfig, Quota
from broker.domain import Reason
from broker.feasibility import feasibility, request_problems
from tests.builders import SpecBuilder, spec


@pytest.mark.parametrize(
    ("builder", "reason", "words"),
    [
        (spec(), Reason.WaitingForAdmission, "valid"),
        (spec().replicas(5).gpus(8).flavors("h100-80g"), Reason.ExceedsCapacity,
         "needs 5 x 8 GPUs within one rack; the largest such domain (pool k8s-h100) holds 4 "
         "replicas; short by 1 replicas (8 GPUs)"),
        (spec().replicas(2).gpus(8).topology("node"), Reason.ExceedsCapacity,
         "within one node"),
        (spec().replicas(9).gpus(8).topology(None).flavors("h100-80g").backend("slurm"),
         Reason.ExceedsCapacity, "in one pool"),
        (spec().replicas(1).gpus(16).topology(None), Reason.ExceedsCapacity,
         "each replica needs 16 GPUs and the largest node of an acceptable pool has 8"),
        (spec().set("flavors", []).set("constraints", {"min_gpu_memory_gb": 141}),
         Reason.NoPoolOffersFlavor, "no configured flavor matches"),
    ],
    ids=["fits", "rack-too-small", "node-too-small", "pool-too-small",
         "replica-larger-than-node", "constraints-match-nothing"],
)
def test_feasibility(
    example_config: IsthmusConfig, builder: SpecBuilder, reason: Reason, words: str
) -> None:
    verdict = feasibility(example_config, builder.build())
    assert verdict.reason == reason
    assert words in verdict.message
    assert verdict.ok == (reason is Reason.WaitingForAdmission)


def _with_quotas(cfg: IsthmusConfig, quotas: dict[str, dict[str, dict[str, int]]]) -> IsthmusConfig:
    teams = [
        t.model_copy(update={"quotas": {f: Quota(**q) for f, q in quotas.get(t.name, {}).items()}})
        for t in cfg.teams
    ]
    return cfg.model_copy(update={"teams": teams})


@pytest.mark.parametrize(
    ("quotas", "words"),
    [
        ({"vision": {"a100-80g": {"nominal": 16, "borrowing_limit": 8}},
          "language": {"a100-80g": {"nominal": 32, "lending_limit": 16}}},
         "needs 32 GPUs; the most team vision can reach in cohort research is 24 (a100-80g: "
         "nominal 16 + borrowable 8), short by 8"),
        ({"vision": {"a100-80g": {"nominal": 16}},
          "language": {"a100-80g": {"nominal": 32, "lending_limit": 8}}},
         "is 24 (a100-80g: nominal 16 + borrowable 8)"),
        ({"vision": {"a100-80g": {"nominal": 8, "borrowing_limit": 0}},
          "language": {"a100-80g": {"nominal": 32}}},
         "is 8 (a100-80g: nominal 8 + borrowable 0)"),
    ],
    ids=["borrowing-limit", "lending-limit", "no-borrowing"],
)
def test_quota_reachable_in_cohort(
    example_config: IsthmusConfig, quotas: dict[str, dict[str, dict[str, int]]], words: str
) -> None:
    cfg = _with_quotas(example_config, quotas)
    verdict = feasibility(cfg, spec().replicas(4).gpus(8).flavors("a100-80g").build())
    assert verdict.reason is Reason.NoQuotaInCohort
    assert words in verdict.message


def test_no_pool_of_the_backend_kind(example_config: IsthmusConfig) -> None:
    cfg = example_config.model_copy(
        update={"pools": [p for p in example_config.pools if p.backend != "sim-k8s"]}
    )
    verdict = feasibility(cfg, spec().backend("k8s").build())
    assert verdict.reason is Reason.NoPoolOffersFlavor
    assert "on backend kind 'k8s'" in verdict.message


def test_team_without_any_quota_is_rejected(example_config: IsthmusConfig) -> None:
    teams = [t.model_copy(update={"quotas": {}}) for t in example_config.teams]
    cfg = example_config.model_copy(update={"teams": teams})
    verdict = feasibility(cfg, spec().build())
    assert verdict.reason is Reason.NoQuotaInCohort
    assert "is 0" in verdict.message


@pytest.mark.parametrize(
    ("builder", "field"),
    [
        (spec().team("robotics"), "team"),
        (spec().flavors("h100-80g", "b200"), "flavors[1]"),
        (spec().set("priority", "urgent"), "priority"),
        (spec().replicas(300).gpus(1), "gang.replicas"),
    ],
    ids=["unknown-team", "unknown-flavor", "unknown-priority", "replicas-cap"],
)
def test_request_problems(example_config: IsthmusConfig, builder: SpecBuilder, field: str) -> None:
    problems = request_problems(example_config, builder.build(), None)
    assert [p.field for p in problems] == [field]


def test_user_may_submit_only_for_own_team(example_config: IsthmusConfig) -> None:
    problems = request_problems(example_config, spec().build(), "language")
    assert problems and problems[0].field == "team" and "token" in problems[0].message
    assert problems[0].forbidden
    assert not any(p.forbidden for p in request_problems(example_config, spec().build(), "vision"))


def _slurm_runs_no_images(cfg: IsthmusConfig) -> IsthmusConfig:
    backends = [b.model_copy(update={"settings": {**b.settings, "container": {"runtime": "none"}}})
                if b.serves_as.value == "slurm" else b for b in cfg.backends]
    return cfg.model_copy(update={"backends": backends})


IMAGE_CMD = {"image": "registry.local/train:1", "command": ["python", "t.py"]}
BATCH = {"image": "registry.local/hpc:1", "script": "#!/bin/bash\nsrun t\n", "launcher": "batch"}


@pytest.mark.parametrize(("backend", "entrypoint", "reason"), [
    ("slurm", IMAGE_CMD, Reason.NoPoolRunsImages),
    ("any", IMAGE_CMD, Reason.WaitingForAdmission),  # Kubernetes pools run it
    ("slurm", BATCH, Reason.WaitingForAdmission),  # the image is Kubernetes' only
    ("slurm", {"command": ["python", "t.py"]}, Reason.WaitingForAdmission),  # bare
], ids=["image-slurm-only", "image-any", "sbatch-script", "no-image"])
def test_an_image_job_no_pool_could_run_is_rejected(
    example_config: IsthmusConfig, backend: str, entrypoint: dict[str, object], reason: Reason
) -> None:
    cfg = _slurm_runs_no_images(example_config)
    verdict = feasibility(cfg, spec().backend(backend).set("entrypoint", entrypoint).build())
    assert verdict.reason is reason, verdict
    if reason is Reason.NoPoolRunsImages:
        assert "entrypoint.image" in verdict.message and "slurm-h100" in verdict.message
    # with the example's own runtime (pyxis) every one of them can run
    ok = feasibility(example_config, spec().backend(backend).set("entrypoint", entrypoint).build())
    assert ok.ok, ok


@pytest.mark.parametrize(("kind", "settings", "runs"), [
    ("k8s", {}, True),
    ("slurm", {}, False),  # the default runtime is none
    ("slurm", {"container": {"runtime": "none"}}, False),
    ("slurm", {"container": {"runtime": "oci"}}, True),
    ("sim", {}, True),
    ("sim", {"container": {"runtime": "none"}}, False),
])
def test_which_backends_run_images(kind: str, settings: dict[str, object], runs: bool) -> None:
    from broker.config import Backend
    assert Backend(name="b", kind=kind, settings=settings).runs_images is runs


def _sized(cfg: IsthmusConfig, **per_pool: dict[str, object]) -> IsthmusConfig:
    pools = []
    for p in cfg.pools:
        extra = per_pool.get(p.name.replace("-", "_"), per_pool.get("every"))
        if extra is not None and p.capacity is not None:
            p = p.model_copy(update={"capacity": p.capacity.model_copy(update=extra)})
        pools.append(p)
    return cfg.model_copy(update={"pools": pools})


def test_a_replica_larger_than_every_declared_node_is_rejected_naming_the_largest(
        example_config: IsthmusConfig) -> None:
    """Issue 34: a job asking more CPUs or memory per replica than any node has waited QUEUED
    for ever; where every acceptable pool declares its nodes, it is REJECTED, naming the
    largest node and what to ask for."""
    cfg = _sized(example_config, every={"cpus_per_node": 96, "memory_per_node": 1024 * 2**30},
                 k8s_h100={"cpus_per_node": 128, "memory_per_node": 2048 * 2**30})
    cpus = feasibility(cfg, spec().set("gang", {"replicas": 1, "gpus_per_replica": 8,
                                                "cpus_per_replica": 200}).build())
    assert (cpus.ok, cpus.reason) == (False, Reason.ExceedsCapacity)
    assert cpus.message == (
        "gang.cpus_per_replica: each replica needs 200 CPUs, and the largest node of an "
        "acceptable pool (pool k8s-h100) has 128; ask for at most 128 per replica, or spread "
        "the work over more replicas")
    memory = feasibility(cfg, spec().set("gang", {"replicas": 1, "gpus_per_replica": 8,
                                                  "memory_per_replica": "3Ti"}).build())
    assert memory.reason == Reason.ExceedsCapacity
    assert "needs 3Ti of memory" in memory.message and "has 2Ti" in memory.message
    # what the largest node holds is fine; and a pool that declares nothing decides nothing
    fits = spec().set("gang", {"replicas": 1, "gpus_per_replica": 8, "cpus_per_replica": 128})
    assert feasibility(cfg, fits.build()).ok
    partly = _sized(example_config, k8s_h100={"cpus_per_node": 16})
    assert feasibility(partly, spec().set("gang", {"replicas": 1, "gpus_per_replica": 8,
                                                   "cpus_per_replica": 200}).build()).ok
