"""Resolving what a run ran with, from the facts of its started gang."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.domain.attempts import RunSnapshot
from broker.domain.facts import Fact, Phase
from broker.domain.reproducibility import digest_of, entrypoint_sha256, resolve
from broker.domain.spec import JobSpec

NOW = datetime(2026, 12, 1, tzinfo=UTC)
A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def _snapshot(**entry: object) -> RunSnapshot:
    return RunSnapshot.of(JobSpec.model_validate({
        "name": "t", "team": "vision", "gang": {"replicas": 2, "gpus_per_replica": 8},
        "flavors": ["h100-80g"], "entrypoint": entry or {"script": "#!/bin/sh\necho hi"},
        "code_version": "git:abc", "data_version": "ds:1",
    }))


def _fact(image_ids: tuple[str, ...] = (), gpu: tuple[str, ...] = ()) -> Fact:
    return Fact(backend="b", backend_name="isthmus-x-1", phase=Phase.RUNNING, observed_at=NOW,
                nodes=("n2", "n1"), image_ids=image_ids, gpu_models=gpu)


@pytest.mark.parametrize(("ref", "digest"), [
    ("docker-pullable://reg/x@" + A, A), ("reg/x@" + A, A), ("reg/x:1", None), ("", None),
])
def test_digest_of(ref: str, digest: str | None) -> None:
    assert digest_of(ref) == digest


@pytest.mark.parametrize(("image", "ids", "digest"), [
    ("reg/x:1", ("docker://reg/x@" + A,) * 2, A),  # the ranks' digest behind the tag
    ("reg/x@" + B, (), B),  # nothing reported: the pinned reference
    ("reg/x:1", (), None),  # a tag and no report: unknown, never guessed
    ("reg/x:1", ("reg/x@" + A, "reg/x@" + B), None),  # ranks disagree: no single digest
], ids=["from-ranks", "pinned", "unknown", "ranks-disagree"])
def test_image_digest(image: str, ids: tuple[str, ...], digest: str | None) -> None:
    snap = _snapshot(image=image, command=["python", "t.py"])
    assert resolve(snap, _fact(ids), NOW).image_digest == digest


def test_script_hash_gpu_models_and_versions() -> None:
    snap = _snapshot()
    got = resolve(snap, _fact(gpu=("h100", "h100")), NOW)
    assert got.entrypoint_sha256 == entrypoint_sha256(snap) != entrypoint_sha256(
        _snapshot(script="#!/bin/sh\necho bye"))
    assert got.gpu_models == ("h100",) and got.nodes == ("n1", "n2")
    assert (got.code_version, got.data_version) == ("git:abc", "ds:1")
    assert got.image is None and got.image_digest is None
