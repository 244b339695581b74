"""Backend settings are checked with the adapters' own schemas by `isthmus config check` and
at server start, each problem naming its path; the server refuses what the check refuses."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from broker.cli.main import app
from broker.config import parse_config
from broker.control.wiring import check_backends
from broker.server import ServerError, run
from tests.harness.paths import EXAMPLE_CONFIG, LOCAL_CONFIG

# the Slurm and Kubernetes adapters' checks, on the configuration of the real test clusters
BASE: dict[str, Any] = yaml.safe_load(LOCAL_CONFIG.read_text())
SLURM, K8S = 0, 1  # backends[] of examples/isthmus-local.yaml


def _settings(i: int, **values: Any) -> Any:
    def mutate(c: dict[str, Any]) -> None:
        c["backends"][i]["settings"].update(values)
    return mutate


def _rename(i: int, old: str, new: str) -> Any:
    def mutate(c: dict[str, Any]) -> None:
        s = c["backends"][i]["settings"]
        s[new] = s.pop(old)
    return mutate


CASES = [
    ("k8s-typo", _rename(K8S, "kubeconfig", "kubeconfg"),
     "backends[1].settings.kubeconfg: unknown k8s backend setting; did you mean 'kubeconfig'?"),
    ("slurm-transport", _settings(SLURM, transport="sbatch"),
     "backends[0].settings.transport: Input should be 'cli' or 'rest'"),
    ("slurm-timeout-text", _settings(SLURM, timeout="soon"),
     "backends[0].settings.timeout: Input should be a valid number"),
    ("slurm-rest-without-url", _settings(SLURM, transport="rest"),
     "backends[0].settings.rest_url: required when transport is 'rest'"),
    ("slurm-directives-one-string", _settings(SLURM, extra_directives="--account=ml"),
     "backends[0].settings.extra_directives: Input should be a valid tuple"),
    ("k8s-mode", _settings(K8S, modes={"k8s-h100": "slurm"}),
     "backends[1].settings.modes.k8s-h100: 'slurm'"),
    ("k8s-mode-of-no-pool", _settings(K8S, modes={"elsewhere": "plain"}),
     "backends[1].settings.modes.elsewhere: no pool elsewhere on this backend"),
    ("k8s-negative-timeout", _settings(K8S, request_timeout_s=0),
     "backends[1].settings.request_timeout_s: must be > 0 seconds"),
    ("slurm-pool-without-partition", lambda c: c["pools"][0].pop("partition"),
     "pools[0].partition: a Slurm pool needs a partition"),
    ("k8s-pool-without-selector", lambda c: c["pools"][2].pop("node_selector"),
     "pools[2].node_selector: a Kubernetes pool needs a node selector"),
]


@pytest.mark.parametrize(("mutate", "line"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_backend_problems_name_their_path(mutate: Any, line: str) -> None:
    data = copy.deepcopy(BASE)
    mutate(data)
    problems = check_backends(parse_config(data))
    assert any(p.startswith(line) for p in problems), problems


@pytest.mark.parametrize("example", [EXAMPLE_CONFIG, LOCAL_CONFIG], ids=["sim", "local"])
def test_the_examples_pass(example: Path) -> None:
    assert check_backends(parse_config(yaml.safe_load(example.read_text()))) == []


def _write(tmp_path: Path, mutate: Any) -> Path:
    data = copy.deepcopy(BASE)
    mutate(data)
    path = tmp_path / "isthmus.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("mutate", "path"), [
    (_rename(K8S, "kubeconfig", "kubeconfg"), "backends[1].settings.kubeconfg"),
    (_settings(SLURM, transport="sbatch"), "backends[0].settings.transport"),
], ids=["kubeconfg", "transport-sbatch"])
def test_config_check_and_server_refuse_bad_settings(tmp_path: Path, mutate: Any,
                                                     path: str) -> None:
    """Before: `config check` said OK and the server started without the backend."""
    bad = _write(tmp_path, mutate)
    result = CliRunner().invoke(app, ["config", "check", str(bad)])
    assert result.exit_code != 0
    assert path in " ".join(result.output.split())
    with pytest.raises(ServerError, match=path.replace("[", r"\[").replace("]", r"\]")):
        run(bad, db_url=f"sqlite:///{tmp_path / 'isthmus.db'}", port=1)
    assert not (tmp_path / "isthmus.db").exists()  # refused before touching anything
    served = CliRunner().invoke(app, ["server", "--config", str(bad), "--db",
                                      f"sqlite:///{tmp_path / 'isthmus.db'}"])
    assert served.exit_code != 0 and path in " ".join(served.output.split())
