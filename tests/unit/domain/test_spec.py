from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from broker.domain import JobSpec
from broker.domain.units import format_duration, parse_duration, parse_size
from tests.builders import CANONICAL, spec


def test_canonical_example_validates() -> None:
    s = JobSpec.model_validate(CANONICAL)
    assert s.gang.total_gpus == 16
    assert s.max_runtime == 7200
    assert s.topology.required == "rack"
    assert s.api_version == "isthmus/v1"


def test_hash_is_stable_and_ignores_key_order_and_defaults() -> None:
    a = JobSpec.model_validate(CANONICAL)
    b = JobSpec.model_validate(dict(reversed(list(CANONICAL.items()))) | {"queue": "default"})
    assert a.spec_hash() == b.spec_hash()
    assert a.spec_hash() != spec().replicas(3).build().spec_hash()


def _errors(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(data)
    return {".".join(map(str, e["loc"])): e["msg"] for e in info.value.errors()}


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda d: d["gang"].update(replicas=0), "gang.replicas", "greater than or equal to 1"),
        (lambda d: d["gang"].update(gpus_per_replica=-8), "gang.gpus_per_replica", "greater"),
        (lambda d: d.update(bogus=1), "bogus", "Extra inputs"),
        (lambda d: d["gang"].update(gpu=8), "gang.gpu", "Extra inputs"),
        (lambda d: d.update(name="Llama FT"), "name", "pattern"),
        (lambda d: d.update(max_runtime="2 hours"), "max_runtime", "'2h', '90m'"),
        (lambda d: d.update(max_runtime="0s"), "max_runtime", "positive"),
        (lambda d: d.update(backend="lsf"), "backend", "'slurm', 'k8s' or 'any'"),
        (lambda d: d.update(entrypoint={"image": "x"}), "entrypoint", "either 'command'"),
        (lambda d: d.update(flavors=[]), "", "give 'flavors'"),
        (lambda d: d.update(flavors=["a", "a"]), "flavors", "listed once"),
        (lambda d: d.update(env={"1BAD": "x"}), "env", "invalid variable name"),
        (lambda d: d.update(topology={"required": "node", "preferred": "rack"}), "topology",
         "looser"),
        (lambda d: d.update(retry={"max_attempts": 0}), "retry.max_attempts", "greater"),
        (lambda d: d.update(mounts=[{"name": "ds", "path": "data"}]), "mounts.0.path", "pattern"),
        (lambda d: d.update(labels={"my team": "x"}), "labels", "label key 'my team'"),
        (lambda d: d.update(labels={"team": "a b"}), "labels", "label 'team' value 'a b'"),
        (lambda d: d.update(labels={"isthmus.io/job": "x"}), "labels", "reserved"),
        (lambda d: d.update(labels={"Example.com/x": "y"}), "labels", "DNS subdomain"),
        (lambda d: d.update(annotations={"-bad": "anything"}), "annotations",
         "annotation key '-bad'"),
    ],
    ids=["zero-replicas", "negative-gpus", "unknown-field", "unknown-nested", "bad-name",
         "bad-duration", "zero-duration", "bad-backend", "no-command", "no-flavors",
         "dup-flavors", "bad-env", "looser-preferred", "zero-attempts", "relative-mount",
         "label-key-space", "label-value-space", "label-reserved", "label-prefix-case",
         "annotation-key"],
)
def test_validation_names_the_field(mutate: Any, field: str, words: str) -> None:
    data = spec().dict()
    mutate(data)
    errors = _errors(data)
    assert field in errors, errors
    assert words in errors[field]


def test_kubernetes_style_labels_and_annotations_are_accepted() -> None:
    data = spec().dict() | {
        "labels": {"app.kubernetes.io/name": "llama", "team": "", "example.com/run_id": "r.1-A"},
        "annotations": {"isthmus.io/fake-duration": "2s", "note": "free text: any value"},
    }
    s = JobSpec.model_validate(data)
    assert s.labels["example.com/run_id"] == "r.1-A"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("1d", 86400), ("600", 600),
     (30, 30)],
)
def test_durations(text: str | int, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("text", "size"), [("64Gi", 64 * 2**30), ("512Mi", 512 * 2**20), ("2G", 2 * 10**9), (1, 1)]
)
def test_sizes(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "h", "2x", "-5m", True])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)
