"""Tenancy at the door: reserved label and annotation keys, mounts outside the team's
allow-list and malformed mount names or paths are a 422 naming the key, and nothing is stored
(so none of them can reach a backend), on both databases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.config import IsthmusConfig, Tenancy
from broker.store import Database
from tests.builders import spec


@pytest.fixture
def client(db: Database, example_config: IsthmusConfig) -> Iterator[TestClient]:
    team = spec().dict()["team"]
    tenancy = Tenancy(mounts={team: ["imagenet", "shared.ckpt"]},
                      exempt_key_prefixes=["isthmus.io/fake-"])
    config = example_config.model_copy(update={"tenancy": tenancy})
    with TestClient(create_app(config, db), raise_server_exceptions=False) as c:
        yield c


def _body(**fields: Any) -> dict[str, Any]:
    return spec().dict() | fields


REFUSED: list[Any] = [
    pytest.param(_body(annotations={"sidecar.istio.io/inject": "false"}),
                 "annotations.sidecar.istio.io/inject", id="istio-opt-out"),
    pytest.param(_body(labels={"kueue.x-k8s.io/queue-name": "other-team"}),
                 "labels.kueue.x-k8s.io/queue-name", id="kueue-queue-label"),
    pytest.param(_body(annotations={"scheduling.k8s.io/group-name": "g"}),
                 "annotations.scheduling.k8s.io/group-name", id="volcano-group"),
    pytest.param(_body(annotations={
        "container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}),
        "annotations.container.apparmor.security.beta.kubernetes.io/trainer", id="apparmor"),
    pytest.param(_body(annotations={"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}),
                 "annotations.seccomp.security.alpha.kubernetes.io/pod", id="seccomp"),
    pytest.param(_body(annotations={"isthmus.io/teardown": "x"}),
                 "annotations.isthmus.io/teardown", id="isthmus-annotation"),
    pytest.param(_body(annotations={"volcano.sh/queue-name": "q"}),
                 "annotations.volcano.sh/queue-name", id="volcano-sh"),
    pytest.param(_body(mounts=[{"name": "other-teams-data", "path": "/data"}]),
                 "mounts[0].name", id="mount-not-allowed"),
    pytest.param(_body(mounts=[{"name": "ImageNet_1", "path": "/data"}]),
                 "mounts.0.name", id="mount-name-not-dns"),
    pytest.param(_body(mounts=[{"name": "imagenet", "path": "/data/../etc"}]),
                 "mounts.0.path", id="mount-path-dotdot"),
    pytest.param(_body(mounts=[{"name": "imagenet", "path": "/"}]),
                 "mounts.0.path", id="mount-path-root"),
    pytest.param(_body(mounts=[{"name": "imagenet", "path": "/a"},
                               {"name": "shared.ckpt", "path": "/a"}]),
                 "mounts", id="mount-path-twice"),
]


@pytest.mark.parametrize(("body", "field"), REFUSED)
def test_tenancy_violations_are_a_422_naming_the_key(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    fields = {e["field"] for e in r.json()["errors"]}
    assert field in fields, r.json()
    assert client.get("/v1/jobs").json()["items"] == []


def test_allowed_mounts_and_exempt_keys_are_accepted(client: TestClient) -> None:
    body = _body(mounts=[{"name": "imagenet", "path": "/data"},
                         {"name": "shared.ckpt", "path": "/ckpt", "read_only": False}],
                 annotations={"isthmus.io/fake-duration": "1s", "example.com/x": "y"},
                 labels={"example.com/run": "r1"})
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text


def test_reserved_prefixes_are_configurable(
    db: Database, example_config: IsthmusConfig
) -> None:
    config = example_config.model_copy(
        update={"tenancy": Tenancy(reserved_key_prefixes=["example.com/"])})
    with TestClient(create_app(config, db), raise_server_exceptions=False) as c:
        r = c.post("/v1/jobs", json=_body(annotations={"example.com/x": "y"}))
        assert r.status_code == 422 and "example.com/" in r.text
        r = c.post("/v1/jobs", json=_body(annotations={"sidecar.istio.io/inject": "false"}))
        assert r.status_code == 201, r.text
