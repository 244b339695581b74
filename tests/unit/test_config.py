from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.config import ConfigError, load_config, parse_config
from tests.harness.paths import EXAMPLE_CONFIG

BASE: dict[str, Any] = yaml.safe_load(EXAMPLE_CONFIG.read_text())


def test_example_config_loads() -> None:
    cfg = load_config(EXAMPLE_CONFIG)
    assert {f.name for f in cfg.flavors} == {"h100-80g", "a100-80g"}
    assert cfg.team("vision") is not None
    assert cfg.auth.mode == "none"


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda c: c["pools"][0].update(flavor="b200"),
         "pools[0].flavor: 'b200' is not in flavors"),
        (lambda c: c["pools"][1].update(backend="x"), "pools[1].backend: 'x' is not in backends"),
        (lambda c: c["teams"][0].update(cohort="nope"), "teams[0].cohort: 'nope'"),
        (lambda c: c["teams"][0]["quotas"].update({"b200": {"nominal": 1}}),
         "teams[0].quotas.b200"),
        (lambda c: c["server"].update(host="0.0.0.0"), "only on a loopback listener"),
        (lambda c: c["flavors"].append(copy.deepcopy(c["flavors"][0])), "duplicate name"),
        (lambda c: c.update(auth={"mode": "token", "tokens": [{"name": "a", "team": "vision"}]}),
         "exactly one of token_sha256 or token_env"),
        (lambda c: c.update(surprise=1), "surprise: Extra inputs"),
    ],
    ids=["pool-flavor", "pool-backend", "team-cohort", "quota-flavor", "open-on-public",
         "duplicate", "token-secret", "unknown-key"],
)
def test_bad_config_names_the_field(mutate: Any, words: str) -> None:
    data = copy.deepcopy(BASE)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert words in str(info.value)


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("flavors: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
